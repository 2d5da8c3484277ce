"""PP x TP profiles on real gloo ranks (subprocesses, each bounded by a timeout): the (pp, tp) mesh, one stage's TP
ranks timed as its slowest, per-TP-rank pools checked for leaks, a policy written; a stopped TP rank ends the run.
The mesh and the model's TP split refused before launch: tests/run/test_tp_input.py."""

import json
import re
import sys

import pandas as pd
import pytest

from tests.multirank import run_cli
from tests.run.test_faults import LONG, alive, deadline_line, rank_pids, read_until, start, stop_rank

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]

SMALL = (
    "--base-chunk-size",
    "64",
    "--requests-per-probe",
    "8",
    "--num-prefix-lens",
    "2",
    "--warmup",
    "1",
    "--overhead-repeats",
    "1",
)
"""Small enough for 4 ranks on 2 cores; B = 64, the least a fitted policy aligns to."""


def read_run(out):
    return pd.read_csv(out / "samples.csv"), json.loads((out / "run.json").read_text())


def test_torchrun_with_four_processes_and_tp_size_2_profiles_pp2_tp2_writes_a_policy_and_benches(tmp_path):
    """torchrun itself (the one launch of the suite through it) starting 4 ranks: --tp-size 2 makes it PP2 x TP2."""
    out = tmp_path / "run"
    r = run_cli(
        "--standalone",
        "--nproc-per-node",
        "4",
        "-m",
        "ppprof",
        "profile",
        "--model",
        "tiny-hybrid",
        "--tp-size",
        "2",
        "--layer-partition",
        "3,5",
        *SMALL,
        "--packed-forwards",
        "4",
        "--out",
        str(out),
        launcher=[sys.executable, "-m", "torch.distributed.run"],
    )
    assert r.returncode == 0, r.stderr[-3000:]
    samples, run = read_run(out)
    assert (run["world_size"], run["pp_size"], run["tp_size"]) == (4, 2, 2)
    assert run["config"]["nproc_per_node"] == 4 and run["layer_partition"] == [3, 5]
    assert run["model"]["name"] == "tiny-hybrid"
    assert list(samples.columns) == [
        "probe",
        "kind",
        "request",
        "prefix_len",
        "chunk_size",
        "stage0_latency_ms",
        "stage1_latency_ms",
        "latency_ms",
        "slowest_stage",
        "design_step",
    ]
    assert samples[["stage0_latency_ms", "stage1_latency_ms"]].gt(0).all().all()
    # the default adaptive design: rank 0 alone (not stage 0's other TP rank) chooses each next probe from its rows
    steps = samples["design_step"]
    assert steps.iloc[0] == 0 and steps.diff().fillna(0).between(0, 1).all() and steps.max() >= 1, steps.tolist()
    assert run["design"]["design"] == "adaptive" and run["design"]["stopping_reason"] not in (None, "grid")
    assert run["design"]["requests"] == len(samples)
    for key in ("median_forward_ms_per_tp_rank", "peak_memory_bytes_per_tp_rank"):
        assert len(run[key]) == 2 and all(len(per_stage) == 2 for per_stage in run[key]), run[key]
    policy = json.loads((out / "policy.json").read_text())
    provenance = policy["report"]["provenance"]
    assert provenance["pp_size"] == 2 and provenance["tp_size"] == 2
    logs = {rank: (out / f"rank{rank}.log").read_text() for rank in range(4)}
    for rank, log in logs.items():
        assert f"stage {rank // 2}/2 (TP rank {rank % 2} of 2)" in log, log[:2000]
        assert "pools back to full capacity" in log and "leak" not in log
    # the bench runs the profile's mesh again: real chunked prompts through the PP2 x TP2 pipeline
    bench = tmp_path / "bench"
    r = run_cli(
        "bench",
        str(out / "policy.json"),
        "--prompt-len",
        "256",
        "--repeats",
        "1",
        "--strategies",
        "fixed,policy",
        "--out",
        str(bench),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = pd.read_csv(bench / "bench.csv")
    assert {a.split("-")[0] for a in rows["arm"]} == {"fixed", "policy"} and rows["compute_ms"].gt(0).all()
    assert set(rows["stage"]) == {0, 1} and "leak" not in r.stderr
    # and the serving bench: every TP rank of the first stage runs the same scheduler, so the TP peers' batches agree
    served = tmp_path / "serve" / "serving.json"
    r = run_cli(
        "serve-bench", str(out / "policy.json"), "--concurrency", "2", "--num-prompts", "3", "--prompt-lens", "200",
        "--repeats", "1", "--strategies", "fixed", "--out", str(served), "--verbose",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    cell = json.loads(served.read_text())["levels"]["concurrency-2"]["fixed"]
    assert (
        cell["num_requests"] == 3 and r.stderr.count("pools back to full capacity") == 2 * 4
    )  # warm-up, the cell (--verbose: every rank's line)


@pytest.mark.parametrize("model", ["tiny-mla", "tiny-gdn"])
def test_mla_and_gated_deltanet_profile_on_one_stage_of_two_tp_ranks_and_write_a_policy(tmp_path, model):
    """MLA (query heads split, the latent pool whole on each TP rank) and Gated DeltaNet (heads split, each TP rank's
    states in its own Mamba-pool slot) through the whole profile on one stage of 2 gloo ranks (PP1 x TP2: the PP x
    TP mesh itself is the 4-rank test's); every rank's pools back to full, the pipeline overhead left unmeasured."""
    out = tmp_path / "run"
    r = run_cli(
        "profile", "--model", model, "--pp-size", "1", "--tp-size", "2", *SMALL[:-2], "--overhead-repeats", "0",
        "--packed-forwards", "4", "--design", "grid", "--out", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    samples, run = read_run(out)
    assert (run["world_size"], run["pp_size"], run["tp_size"]) == (2, 1, 2) and run["model"]["name"] == model
    assert run["layer_partition"] == [len(run["model"]["layers"])]
    assert samples["stage0_latency_ms"].gt(0).all() and "stage1_latency_ms" not in samples
    assert run["config"]["overhead_repeats"] == 0
    assert "pipeline_overhead" not in run and "overhead_wall_s" not in run  # not measured
    policy = json.loads((out / "policy.json").read_text())
    provenance = policy["report"]["provenance"]
    assert provenance["tp_size"] == 2 and provenance["model"] == model
    for rank in range(2):
        log = (out / f"rank{rank}.log").read_text()
        assert f"stage 0/1 (TP rank {rank} of 2)" in log, log[:2000]
        assert "pools back to full capacity" in log and "leak" not in log


def test_a_stopped_tp_rank_ends_the_run_within_the_deadline(tmp_path):
    out = tmp_path / "run"
    timeout_s = 3
    p = start(
        "profile",
        "--out",
        str(out),
        *LONG,
        "--pp-size",
        "1",
        "--tp-size",
        "2",
        "--overhead-repeats",
        "0",
        "--timeout",
        str(timeout_s),
    )
    try:
        read_until(p, "probe 2 (prefix")
        ranks = rank_pids(p.pid)
        rest, took = stop_rank(p, ranks[1])  # TP rank 1 of the one stage: rank 0 waits in a TP collective
    finally:
        p.kill()
    assert p.returncode == 1, rest[-3000:]
    line, within = deadline_line(rest, timeout_s)
    assert "Traceback" not in rest
    assert took < within + 15, took
    assert not any(alive(pid) for pid in ranks.values())
    assert json.loads((out / "run.json").read_text())["status"] == f"failed: {line}"


def test_a_forward_that_fails_on_one_tp_rank_ends_every_rank_with_its_message(tmp_path):
    out = tmp_path / "run"
    r = run_cli(
        "profile",
        "--out",
        str(out),
        *LONG,
        "--pp-size",
        "1",
        "--tp-size",
        "2",
        "--overhead-repeats",
        "0",
        "--timeout",
        "3",
        "--inject-fault",
        "raise-on-one-tp-rank",
        timeout=120,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    # the third timed request of the sweep, on TP rank 1 alone: rank 0 waits for it in an all-reduce
    message = re.search(
        r"error: \[rank 1\] (rank 1: forward of request 2 \(prefix 0, chunk \d+\) raised "
        r"RuntimeError: injected fault \(--inject-fault raise-on-one-tp-rank\))",
        r.stderr,
    )
    assert message, r.stderr[-3000:]
    assert f"error: [rank 0] {message.group(1)}" in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "did not answer" not in r.stderr
    assert json.loads((out / "run.json").read_text())["status"] == f"failed: {message.group(1)}"
