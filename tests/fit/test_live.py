"""The live refit (`ppprof calibrate`) on forward traces written by the real writer: the committed trace of
serve-bench on tiny-hybrid (tests/runs/tiny-hybrid/trace.jsonl), and traces whose forwards follow a known latency
model, which the refit must recover."""

from __future__ import annotations

import hashlib
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.fit.build import fit
from ppprof.fit.live import calibrate
from ppprof.fit.samples import read_samples
from ppprof.policy import load
from tests.forwards.helpers import write_trace

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "runs" / "tiny-hybrid"
POLICY, TRACE = TINY / "policy.json", TINY / "trace.jsonl"
TRUTH = {"c": 2.0, "b": 0.01, "a": 4e-6, "g": 0.0}
"""The prefix model the synthetic traces follow (ms): t = c + g L + b x + a (2 L x + x^2)."""
STAGE_1 = 0.9
"""Stage 1 runs this fraction of stage 0's time: stage 0 is the bottleneck."""


def truth_ms(L, x) -> float:
    return TRUTH["c"] + TRUTH["g"] * L + TRUTH["b"] * x + TRUTH["a"] * (2 * L * x + x * x)


def known_forwards(prefixes, chunks, extra_piece_ms=0.0, packed=0, seed=0, scale=None):
    """(stage, tp_rank, pieces, ms, t) of single-request forwards at every (prefix, chunk) five times, both stages,
    with 2% multiplicative noise; and `packed` batches of 2-3 pieces costing the additive form plus `extra_piece_ms`
    a piece beyond the first. `scale(stage, L)`: a factor on a forward's time (drift)."""
    rng = np.random.default_rng(seed)
    out, t = [], 1.7e9
    scale = scale or (lambda stage, L: 1.0)
    cells = [(L, x) for L in prefixes for x in chunks for _ in range(5)]
    batches = []
    for _ in range(packed):
        n = int(rng.integers(2, 4))
        batches.append([(int(rng.choice(prefixes)), int(rng.choice(chunks))) for _ in range(n)])
    for pieces in [[cell] for cell in cells] + batches:
        base = TRUTH["c"] + sum(truth_ms(L, x) - TRUTH["c"] for L, x in pieces) + extra_piece_ms * (len(pieces) - 1)
        longest = max(L for L, _ in pieces)
        for stage in (0, 1):
            noise = float(np.exp(rng.normal(0.0, 0.02)))
            ms = base * (1.0 if stage == 0 else STAGE_1) * noise * scale(stage, longest)
            out.append((stage, 0, pieces, ms, t))
            t += 0.01
    return out


def test_calibrate_refits_the_committed_trace_and_names_it(tmp_path):
    out = tmp_path / "calibrated.json"
    r = CliRunner().invoke(main, ["calibrate", str(POLICY), str(TRACE), "-o", str(out)])
    assert r.exit_code == 0, r.output
    policy = load(out)  # the schema's and the rules' checks, as a server loads it
    live = policy.report.provenance["live"]
    assert live["traces"][0]["sha256"] == hashlib.sha256(TRACE.read_bytes()).hexdigest()
    read = sum(1 for line in TRACE.read_text().splitlines() if '"kind": "forward"' in line)
    assert live["forwards_read"] == read
    used = live["forwards_used"]["single"] + live["forwards_used"]["packed"]
    assert used + sum(live["forwards_dropped"].values()) == read, f"{live=}"
    assert live["forwards_used"]["packed"] > 0 and policy.report.packed_forwards is not None
    assert live["time_span_s"] > 0 and live["policy_sha256"] == hashlib.sha256(POLICY.read_bytes()).hexdigest()
    assert "drift (medians per stage and prefix band):" in r.output
    table = r.output.split("drift (medians per stage and prefix band):")[1].splitlines()[1:]
    assert "calibrated ms" in table[0] and {line.split()[0] for line in table[1:]} == {"0", "1"}


def test_a_known_model_is_recovered_from_live_forwards(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, known_forwards([0, 128, 256, 512, 1024, 2048], [32, 64, 128, 256, 512, 1024]), 10**5)
    path, policy, rows = calibrate(POLICY, [trace], tmp_path / "p.json", "prefix")
    live = policy["report"]["provenance"]["live"]
    assert live["stage"] == 0 and live["profile_rows"] == 0, f"{live=}"  # every profiled cell is covered
    coef = {k: v["value"] for k, v in policy["latency_model"]["coefficients"].items()}
    for L in (0, 700, 2048):
        for x in (64, 300, 1024):
            got = coef["c"] + coef["g"] * L + coef["b"] * x + coef["a"] * (2 * L * x + x * x)
            assert math.isclose(got, truth_ms(L, x), rel_tol=0.03), f"{L=} {x=} {got=} {truth_ms(L, x)=}"
    profiled = {(r["stage"], r["band"]): r["profiled_ratio"] for r in rows}
    calibrated = {(r["stage"], r["band"]): r["calibrated_ratio"] for r in rows}
    assert all(abs(v - 1) < 0.05 for k, v in calibrated.items() if k[0] == 0), f"{calibrated=}"
    assert max(abs(v - 1) for v in profiled.values()) > 0.1, "the tiny profile should be off this model"
    assert path.is_file()


def test_profile_rows_fill_only_the_cells_live_forwards_leave(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, known_forwards([0], [64, 256]), 10**5)  # prefix 0 only: the prefix probes stay
    _, policy, _ = calibrate(POLICY, [trace], tmp_path / "p.json", "prefix")
    samples = read_samples(TINY / "samples.csv")

    def band(v: int) -> int:
        return 0 if v == 0 else int(math.floor(math.log2(v))) + 1

    covered = {(0, band(64)), (0, band(256))}
    expected = sum((band(int(L)), band(int(x))) not in covered for L, x in zip(samples.prefix_len, samples.chunk_size))
    live = policy["report"]["provenance"]["live"]
    assert live["profile_rows"] == expected > 0
    # the profile's rows at the live level: the median of the live forwards over the tiny policy's prediction (the
    # forwards all in the profile's cells)
    model = load(POLICY).latency_model
    ratios = [
        truth_ms(0, x) / float(model.planning(load(POLICY).calibration, 0.0).chunk_latency_ms(0, x)) for x in (64, 256)
    ]
    assert min(ratios) * 0.95 <= live["profile_pace"] <= max(ratios) * 1.05, f"{live['profile_pace']=} {ratios=}"
    assert live["profile_pace_source"] == f"the {live['forwards_used']['single']} live forwards in the profile's cells"
    assert policy["report"]["domain"]["prefix_len"][1] == 1024  # the profile's prefixes came in


def test_packed_batches_price_the_per_piece_term(tmp_path):
    trace = tmp_path / "t.jsonl"
    forwards = known_forwards([0, 256, 1024], [32, 64, 256, 512, 1024], extra_piece_ms=1.5, packed=60)
    write_trace(trace, forwards, 10**5)
    _, policy, _ = calibrate(POLICY, [trace], tmp_path / "p.json", "prefix")
    packed = policy["report"]["packed_forwards"]
    assert packed["forwards"] == 60 and packed["stage"] == 0
    assert packed["extra_piece_ms"] == pytest.approx(1.5, rel=0.15), f"{packed=}"


def test_calibrate_writes_nothing_when_the_trace_is_of_another_layout(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, known_forwards([0, 256], [64, 256]), 10**5, pp_size=4)
    r = CliRunner().invoke(main, ["calibrate", str(POLICY), str(trace), "-o", str(tmp_path / "p.json")])
    assert r.exit_code == 2 and "pp_size 4 served, 2 profiled" in r.stderr, r.output
    assert not (tmp_path / "p.json").exists()


def test_a_policy_fitted_without_the_prefix_term_gets_it_and_its_workload_from_the_live_forwards(tmp_path):
    """ATOM's case: a policy fitted on the prefix-free rows alone (its domain, and so its default workload, end at
    prompts of 1 token) is refitted on live forwards at prefixes up to 2048: the model the refit chooses predicts
    the live forwards, and the workload is derived again from the domain they reach."""
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    shutil.copy(TINY / "run.json", wrong / "run.json")
    rows = pd.read_csv(TINY / "samples.csv")
    rows[rows.prefix_len == 0].to_csv(wrong / "samples.csv", index=False)
    _, before = fit(wrong / "samples.csv")
    assert before["report"]["workload"]["prompt_lens"] == [1] and before["report"]["domain"]["prefix_len"] == [0, 0]
    trace = tmp_path / "t.jsonl"
    write_trace(trace, known_forwards([0, 128, 256, 512, 1024, 2048], [32, 64, 128, 256, 512, 1024]), 10**5)
    _, after, rows_ = calibrate(wrong / "policy.json", [trace], tmp_path / "p.json")
    assert after["report"]["domain"]["prefix_len"] == [0, 2048]
    assert max(after["report"]["workload"]["prompt_lens"]) > 2048, after["report"]["workload"]
    assert all(abs(r["calibrated_ratio"] - 1) < 0.05 for r in rows_ if r["stage"] == 0), rows_
    assert max(abs(r["profiled_ratio"] - 1) for r in rows_ if r["stage"] == 0) > 0.3, rows_
