"""`ppprof serve-bench` through real gloo ranks (tiny sizes, a timeout): every arm runs at every level, every
request's chunks add up to its prompt on every stage, batches carry several requests, and the pools are back to full
capacity after every level (the run checks after each and fails loudly). Timings are never asserted. The policy is
the committed tiny run's (tests/runs/tiny-hybrid, B = 256); the input checks, which start no rank, are in
tests/corpus/cases.txt and tests/serving/test_serve_config.py."""

import json
from collections import defaultdict

import pandas as pd
import pytest

from ppprof.serving.arms import SERVING_ARMS
from tests.multirank import TINY_RUN, run_cli

pytestmark = pytest.mark.multirank


def test_serve_bench_serves_every_arm_through_the_real_pipeline(tmp_path):
    out = tmp_path / "serve" / "serving.json"
    # prompts that are not multiples of B, so that a request's last chunk leaves room for the next one's first
    r = run_cli(
        "serve-bench", str(TINY_RUN / "policy.json"), "--concurrency", "1,3", "--num-prompts", "5",
        "--prompt-lens", "300,700", "--repeats", "1", "--out", str(out), "--verbose",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["mode"] == "measured" and doc["pp_size"] == 2
    assert set(doc["levels"]) == {"concurrency-1", "concurrency-3"}
    for arms in doc["levels"].values():
        assert set(arms) == set(SERVING_ARMS)
        for cell in arms.values():
            assert cell["num_requests"] == 5 and cell["throughput_tokens_per_s"] > 0
            assert cell["simulated"]["num_requests"] == 5 and set(cell["vs_simulated"]) == {"throughput", "ttft_mean"}
    assert set(doc["paired"]) == set(doc["levels"])  # policy-load against each other arm, repeat by repeat
    assert all(
        set(p) == {f"policy-load/{a}" for a in SERVING_ARMS if a != "policy-load"} for p in doc["paired"].values()
    )
    rows = pd.read_csv(out.with_name("serving.csv"))
    rows = rows[rows.level != "warm-up"]
    assert sorted(rows.stage.unique()) == [0, 1]
    for (level, arm, stage), g in rows.groupby(["level", "arm", "stage"]):
        served = defaultdict(list)
        for batch in g.sort_values("batch").requests:
            for piece in batch.split():
                rid, rest = piece.split(":")
                prefix, size = (int(v) for v in rest.split("+"))
                assert prefix == sum(served[int(rid)]), f"{level} {arm} stage {stage}: request {rid} out of order"
                served[int(rid)].append(size)
        assert {rid: sum(c) for rid, c in served.items()} == dict(enumerate(doc["prompt_lens"])), (level, arm, stage)
    assert rows[rows.level == "concurrency-3"].pieces.max() > 1, "no batch carried several requests"
    full = [line for line in r.stderr.splitlines() if "pools back to full capacity" in line]
    # --verbose: every rank's lines; 2 ranks x (warm-up + every cell)
    assert len(full) == 2 * (1 + 2 * len(SERVING_ARMS)), r.stderr[-2000:]
    assert (out.parent / "serving.png").stat().st_size > 0
