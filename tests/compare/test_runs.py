"""`ppprof compare` end to end on run folders fitted from synthetic samples (real fits, real files), on the committed
profiles, and on bad input; the samples' drift against exact expectations."""

import dataclasses
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.compare.cells import samples_drift
from ppprof.fit.build import fit_run, rechoose
from ppprof.fit.samples import read_samples
from ppprof.fit.synthetic import SyntheticProbes, SyntheticRun, make_samples, write_run_dir
from ppprof.io import atomic_write_json
from ppprof.policy import load
from ppprof.policy.rule import LatencyModel
from tests.compare.test_forwards import keys

REPO = Path(__file__).resolve().parents[2]
TRUE = LatencyModel("prefix", a=2e-6, b=0.008, c=1.5, g=8e-5)  # about what tiny-hybrid costs on 2 CPU cores, in ms
B = 512
PREFIXES = [512, 1172, 2681, 6135, 14040, 32128]  # the default profile's prefix probes
CHUNKS = [640, 560, 480, 400, 320, 240, 160, 64]


def profile(run_dir: Path, seed: int, model: LatencyModel = TRUE) -> Path:
    """A run folder as `ppprof profile --min-gain 0` leaves it at PP4 (dynamic where the model is adequate and its
    gain's lower bound is above 0: about 3%, where at PP2 it is 0.3-0.6% and the samples cannot always tell it from
    none), from samples with 5% noise drawn with `seed`."""
    frame = make_samples(
        model,
        SyntheticProbes(base_chunk_size=B, prefixes=PREFIXES, chunk_sizes=CHUNKS, noise=0.05, seed=seed, pp_size=4),
    )
    write_run_dir(
        run_dir,
        frame,
        SyntheticRun(base_chunk_size=B, page_size=1, context_len=32768, min_gain=0.0, pp_size=4, num_layers=8),
    )
    fit_run(run_dir, load_rule=False)  # compare judges no under-load rule
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return profile(root / "seed0", 0), profile(root / "seed1", 1)


def doubled_a(policy_path: Path, out: Path) -> Path:
    """The policy with its quadratic coefficient a doubled, and its target and table recomputed (a valid policy)."""
    policy = load(policy_path)
    model = dataclasses.replace(policy.latency_model, a=2 * policy.latency_model.a)
    return atomic_write_json(out, rechoose(policy.data, model, policy.status, policy.reason))


def compare(*args):
    return CliRunner().invoke(main, ["compare", *map(str, args)])


def test_two_seeds_pass_within_default_tolerance(runs, tmp_path):
    base, cand = runs
    assert load(base / "policy.json").status == load(cand / "policy.json").status == "dynamic"
    png, out = tmp_path / "compare.png", tmp_path / "compare.json"
    result = compare(base, cand, "--plot", png, "--out", out)
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith("within tolerance")
    for word in (
        "coefficients: a ",
        "target latency (SGLang's rule):",
        "chunk-size table on prefix_len 0..32128",
        "predicted TTFT, 4 stages",
        "samples: ",
        "ok    ttft",
    ):
        assert word in result.output, word
    report = json.loads(out.read_text())
    assert report["drifted"] is False and png.stat().st_size > 10_000
    assert {c["figure"] for c in report["checks"]} >= {"status", "target", "table", "ttft", "samples"}
    assert [(r["prompt_len"], r["strategy"]) for r in report["ttft"]["rows"]][:6] == [
        (2048, s) for s in ("policy", "policy-history", "greedy", "fixed", "fixed-best", "optimal")
    ]
    assert abs(report["samples"]["median_ratio"] - 1) < 0.03
    sweep = read_samples(base / "samples.csv")
    assert report["samples"]["num_cells"] == len(set(sweep.chunk_size[sweep.prefix_len == 0])) + len(PREFIXES) * len(
        CHUNKS
    )
    as_json = json.loads(compare(base, cand, "--json").output)
    assert as_json["table"] == report["table"] and as_json["checks"] == report["checks"]


def test_doubled_a_drifts_and_says_which_figure(runs, tmp_path):
    base, _ = runs
    doubled = doubled_a(base / "policy.json", tmp_path / "doubled.json")
    assert CliRunner().invoke(main, ["validate", str(doubled)]).exit_code == 0
    for baseline in (base, base / "policy.json"):
        result = compare(baseline, doubled)
        assert result.exit_code == 1, result.output
        assert "DRIFT ttft: " in result.output and "drift beyond tolerance: " in result.output
        line = next(s for s in result.output.splitlines() if s.startswith("DRIFT ttft"))
        assert "(limit 20%)" in line and "+" in line
    report = json.loads(compare(base, doubled, "--json").output)
    worst = next(c for c in report["checks"] if c["figure"] == "ttft")
    assert worst["value"] > 0.3 and report["samples"] is None  # a policy file brings no samples
    a = next(r for r in report["coefficients"] if r["name"] == "a")
    assert a["change"] == pytest.approx(1.0)
    # A tolerance wide enough lets it through; a tighter one on another figure catches it again.
    assert compare(base, doubled, "--tolerance", "ttft=none,target=none,table=none,table_units=100").exit_code == 0
    assert (
        compare(
            base, doubled, "--tolerance", "ttft=none,target=none,table=none,table_units=100", "--tolerance", "coef=50%"
        ).exit_code
        == 1
    )


def test_status_change_with_agreeing_samples_says_so(runs, tmp_path):
    base, _ = runs
    static = tmp_path / "static"
    shutil.copytree(base, static)
    data = json.loads((static / "policy.json").read_text())
    policy = load(base / "policy.json")
    data = rechoose(data, policy.latency_model, "static", "gate rms_residual_fraction fails")
    atomic_write_json(static / "policy.json", data)
    result = compare(base, static)
    assert result.exit_code == 1, result.output
    line = next(s for s in result.output.splitlines() if s.startswith("DRIFT status"))
    assert "dynamic -> static; yet the samples agree (median latency ratios within 20%)" in line


def test_bad_input_exit_2_one_line_nothing_written(runs, tmp_path):
    base, cand = runs
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = tmp_path / "broken.json"
    data = json.loads((base / "policy.json").read_text())
    data["table"]["chunk_size"][1] += 64  # no longer the table of its own rule
    atomic_write_json(broken, data)
    bad_samples = tmp_path / "bad-samples"
    shutil.copytree(cand, bad_samples)
    (bad_samples / "samples.csv").write_text("prefix_len,chunk_size\n0,1\n")
    png = tmp_path / "c.png"
    cases = [
        ((tmp_path / "missing", cand), "does not exist"),
        ((empty, cand), "has no policy.json"),
        ((base, broken), "$.table: chunk "),
        ((base, bad_samples), "lacks column(s) latency_ms"),
        ((base, cand, "--tolerance", "speed=0.1"), "--tolerance 'speed=0.1' is invalid"),
        ((base, cand, "--tolerance", "ttft=-1"), "--tolerance 'ttft=-1' is invalid"),
        ((base, cand, "--prompt-len", "0"), "--prompt-len 0 must be an integer >= 1"),
        ((base, cand, "--pp", "0"), "--pp 0 is invalid"),
    ]
    for args, message in cases:
        result = compare(*args, "--plot", png, "--out", tmp_path / "c.json")
        assert result.exit_code == 2 and message in result.output, (args, result.output)
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not png.exists() and not (tmp_path / "c.json").exists()


def test_a_committed_profile_against_itself_and_against_its_samples_slowed(tmp_path):
    """On a real profile (the committed baseline): itself is within every tolerance with no change; its samples made
    1.6x slower at prefix 0 only drift on the samples figure, naming it, while its policy is unchanged."""
    base = REPO / "results/baseline"
    same = json.loads(compare(base, base, "--json").output)
    assert same["drifted"] is False and all(c["value"] in (0, None) for c in same["checks"]), same["checks"]
    slow = tmp_path / "slow"
    shutil.copytree(base, slow)
    frame = pd.read_csv(slow / "samples.csv")
    columns = [c for c in frame.columns if c.endswith("latency_ms")]
    frame.loc[frame.prefix_len == 0, columns] *= 1.6
    frame.to_csv(slow / "samples.csv", index=False)
    result = compare(base, slow)
    assert result.exit_code == 1, result.output
    drifted = [s.split()[1].rstrip(":") for s in result.output.splitlines() if s.startswith("DRIFT ")]
    assert drifted == ["samples"], result.output


def test_samples_drift_exact(tmp_path):
    frame = make_samples(TRUE, SyntheticProbes(base_chunk_size=B, prefixes=[1024], chunk_sizes=[128, 256], noise=0.0))
    write_run_dir(tmp_path / "a", frame, SyntheticRun(base_chunk_size=B))
    slower = frame.copy()
    slower.loc[slower.prefix_len > 0, ["stage0_latency_ms", "stage1_latency_ms", "latency_ms"]] *= 1.5
    slower = slower[slower.chunk_size != 640]  # one sweep cell only in the baseline
    write_run_dir(tmp_path / "b", slower, SyntheticRun(base_chunk_size=B))
    drift = samples_drift(read_samples(tmp_path / "a/samples.csv"), read_samples(tmp_path / "b/samples.csv"))
    num_sweep = int((frame.kind == "sweep").sum())
    assert drift["num_cells_baseline"] == num_sweep + 2 and drift["num_cells"] == num_sweep + 1
    assert drift["median_ratio"] == pytest.approx(1.0)
    assert drift["worst_cell"]["prefix_len"] == 1024 and drift["worst_cell"]["ratio"] == pytest.approx(1.5)
    assert [(r["prefix_len"], r["num_cells"]) for r in drift["by_prefix"]] == [(0, num_sweep - 1), (1024, 2)]
    assert [r["median_ratio"] for r in drift["by_prefix"]] == pytest.approx([1.0, 1.5])
    assert drift["worst_prefix"]["prefix_len"] == 1024  # the sweep's many cells do not hide it
    assert drift["pace"] is None  # two prefix lengths: a drift at one would be half taken for the machine's
    three = make_samples(
        TRUE, SyntheticProbes(base_chunk_size=B, prefixes=[1024, 4096], chunk_sizes=[128, 256], noise=0.0)
    )
    write_run_dir(tmp_path / "c", three, SyntheticRun(base_chunk_size=B))
    slow = three.copy()
    columns = ["stage0_latency_ms", "stage1_latency_ms", "latency_ms"]
    slow[columns] = slow[columns].mul(slow.prefix_len.map({0: 1.3, 1024: 1.3, 4096: 2.0}), axis=0)
    write_run_dir(tmp_path / "d", slow, SyntheticRun(base_chunk_size=B))
    drift = samples_drift(read_samples(tmp_path / "c/samples.csv"), read_samples(tmp_path / "d/samples.csv"))
    assert drift["pace"] == pytest.approx(1.3)  # the median of the prefix lengths' ratios, one vote each


def noisy_copy(base: Path, run: Path, seed: int = 0) -> Path:
    """The run folder `base` with each row's latencies times its own lognormal factor (sigma 0.35: the cells' medians
    stay, single rows scatter as on a loaded host), its policy refitted."""
    import numpy as np

    shutil.copytree(base, run)
    frame = pd.read_csv(run / "samples.csv")
    factor = np.exp(np.random.default_rng(seed).normal(0.0, 0.35, len(frame)))
    for column in [c for c in frame.columns if c.endswith("latency_ms")]:
        frame[column] *= factor
    frame.to_csv(run / "samples.csv", index=False)
    fit_run(run, load_rule=False)
    return run


def refitted(base: Path, run: Path) -> Path:
    """A copy of the run folder `base` with its policy refitted by this code (its gain's interval recorded)."""
    shutil.copytree(base, run)
    fit_run(run, load_rule=False)
    return run


def test_statuses_are_judged_by_the_gains_intervals(tmp_path):
    """The committed baseline refitted against a copy whose rows scatter: the copy's gain is too uncertain to be
    dynamic, its interval overlaps the baseline's, so the status change is not a drift (nor the fixed chunks' table).
    Against a profile whose gain interval lies apart (tiny-dense's, 1.3%), the status change drifts. A baseline of
    older code has no interval: the gains are judged as before (within 2 points), and beyond, a hint to refit."""
    base = refitted(REPO / "results/baseline", tmp_path / "base")
    noisy = noisy_copy(base, tmp_path / "noisy")
    b, c = (load(p / "policy.json").report.predicted["gain_interval"] for p in (base, noisy))
    assert load(base / "policy.json").status == "dynamic" and load(noisy / "policy.json").status == "static"
    assert c["lower"] < 0.02 <= b["lower"] and c["lower"] <= b["upper"] and b["lower"] <= c["upper"], (b, c)
    for pair in ((base, noisy), (noisy, base)):
        report = json.loads(compare(*pair, "--tolerance", "table=0.001", "--json").output)
        status = report["checks"][0]
        assert status["passed"] and "the intervals overlap" in status["detail"], status
        table = next(ch for ch in report["checks"] if ch["figure"] == "table")
        assert table["value"] > 0.001 and table["passed"] and table["split"], table
    assert "split table" in compare(base, noisy, "--tolerance", "table=0.001").output
    dense = refitted(REPO / "results/bench-reference/tiny-dense/profile", tmp_path / "dense")
    status = json.loads(compare(base, dense, "--json").output)["checks"][0]
    assert not status["passed"] and "the intervals are apart" in status["detail"], status
    older = json.loads(compare(REPO / "results/baseline", noisy, "--json").output)["checks"][0]
    assert older["passed"] and "near the threshold" in older["detail"], older  # its gain within 2 points
    older = json.loads(compare(REPO / "results/baseline", noisy, "--tolerance", "gain=0.001", "--json").output)
    assert not older["checks"][0]["passed"] and "refit both with this code" in older["checks"][0]["detail"], older


def test_a_slower_machine_drifts_on_the_pace_alone(tmp_path):
    """The committed baseline's samples (and measured overhead) made 1.7x slower, as on a CI machine that runs every
    forward slower, refitted: only the pace drifts (the other latency figures are judged at the baseline's pace);
    with the pace widened it is within tolerance; a drift in the shape (prefixed rows slower still) fails on the
    samples even then."""
    base = REPO / "results/baseline"

    def slowed(name: str, factor_at_prefix) -> Path:
        run = tmp_path / name
        shutil.copytree(base, run)
        frame = pd.read_csv(run / "samples.csv")
        factor = frame.prefix_len.map(factor_at_prefix)
        for column in [c for c in frame.columns if c.endswith("latency_ms")]:
            frame[column] *= factor
        frame.to_csv(run / "samples.csv", index=False)
        meta = json.loads((run / "run.json").read_text())
        overhead = meta.get("pipeline_overhead") or {}
        for key in ("ms_per_chunk", "stderr_ms"):
            if isinstance(overhead.get(key), (int, float)):
                overhead[key] *= 1.7
        atomic_write_json(run / "run.json", meta)
        fit_run(run, load_rule=False)
        return run

    slow = slowed("slow", lambda L: 1.7)
    report = json.loads(compare(base, slow, "--json").output)
    assert report["pace"]["ratio"] == pytest.approx(1.7) and report["samples"]["pace"] == pytest.approx(1.7)
    assert "change_at_pace" in keys(report) and not {k for k in keys(report) if "level" in k}, keys(report)
    assert report["tolerances"]["pace"] == 0.2 and "level" not in report["tolerances"]
    drifted = [c["figure"] for c in report["checks"] if not c["passed"]]
    assert drifted == ["pace"], report["checks"]
    ttft = next(c for c in report["checks"] if c["figure"] == "ttft")
    assert ttft["value"] < 0.02, ttft  # the same curve, 1.7x slower: no change at the pace
    result = compare(base, slow, "--tolerance", "pace=1")
    assert result.exit_code == 0, result.output
    assert "ok    pace: the candidate's latencies ran 1.700 x the baseline's" in result.output
    old = compare(base, slow, "--tolerance", "level=1", "--json")  # the old name, as scripts written before pass it
    new = compare(base, slow, "--tolerance", "pace=1", "--json")
    assert old.exit_code == 0 and json.loads(old.output) == json.loads(new.output), old.output
    shape = slowed("shape", lambda L: 1.7 * (1.5 if L >= 5000 else 1.0))
    result = compare(base, shape, "--tolerance", "pace=1")
    assert result.exit_code == 1 and "DRIFT samples: " in result.output, result.output


def test_a_target_that_is_not_positive_is_not_compared():
    """A static policy may carry a target of 0 or below (its model does not grow with the chunk): a ratio of such
    targets means nothing, so the target is not judged; positive targets are, at the candidate's pace."""
    from ppprof.compare.policies import target_change

    assert target_change(0.0, 5.0, 1.0)["change"] is None and target_change(4.0, -1.0, 1.0)["change_at_pace"] is None
    assert target_change(4.0, 5.0, 1.25) == {"baseline": 4.0, "candidate": 5.0, "change": 0.25, "change_at_pace": 0.0}
