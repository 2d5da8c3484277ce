"""SGLang 0.5.23's own scheduler forms the batches on a CPU, its PP loop's micro-batch slots served as event_loop_pp
serves them, with ppprof's sizer put in place by the start-up hook as `python -m ppprof.sglang` puts it
(PPPROF_POLICY set, the hook's sitecustomize first on PYTHONPATH): one fresh interpreter a session
(tests/sglang/scheduler_run.py) runs every arm (fixed, SGLang's own greedy, ppprof's policy and policy-load) at
closed loops of 1, 4 and 16 clients and Poisson arrivals, a loop at async depth 1, a loop for each bad policy, and
a traced loop on each PP rank (PPPROF_TRACE); the tests read every batch it formed and the trace it wrote. Skipped,
with pip's reason, where SGLang's CPU install (tests/sglang/cpu_install.py) cannot be had."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from ppprof.bounds import TRACE_ENV
from ppprof.fit.live import check_match
from ppprof.forwards import read_forwards
from ppprof.policy import load
from ppprof.policy.rule import LatencyModel
from ppprof.serving import arms
from ppprof.serving.scheduler import Capacity
from ppprof.serving.simulate import Arrivals, LoadLevel, serve
from ppprof.sglang import hook

from .cpu_install import installed
from .scheduler_run import ARMS, PP_SIZE, PROMPTS, REQUESTS, stage_clock
from .standin import REPO, shaped

BASELINE = REPO / "results" / "baseline" / "policy.json"
RUNNER = REPO / "tests" / "sglang" / "scheduler_run.py"
ON_PYTHONPATH = REPO / "ppprof" / "sglang" / "on-pythonpath"
LOADS = ("1", "4", "16", "rate-10")
"""Closed loops of 1, 4 and 16 clients, and Poisson arrivals at 10 requests a second."""
RUNS = tuple(f"{arm}:{load}" for arm in ARMS for load in LOADS) + ("policy-load:4:1",)
"""Every arm at every load, and a closed loop of 4 at async depth 1 (3 micro-batch slots)."""
FAILURES = ("other-model", "corrupt", "missing", "raises")
"""Policies SGLang's process must survive on its static chunks: another model's, a corrupted file, a missing file,
and a policy whose answers raise inside get_new_batch_prefill."""


@pytest.fixture(scope="module")
def sglang_run(tmp_path_factory):
    site, why = installed(hook.BUILT_FOR)
    if site is None:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("sglang-run")
    policy = shaped(BASELINE, tmp)
    unit = load(policy).data["prompt_table"]["unit"]
    top = load(policy).prompt_rule.largest_chunk // unit * unit
    rule = {"slots": PP_SIZE, "fill": 2.0, "unit": unit, "full": {"bound_ms": None, "chunk_cap": top}}
    loaded = shaped(BASELINE, tmp / "load", schema_version=5, load=rule)
    out = tmp / "batches.json"
    other = shaped(BASELINE, tmp / "other", **{"provenance.model_shape.hidden_size": 128})
    corrupt = tmp / "corrupt.json"
    corrupt.write_text(policy.read_text()[: len(policy.read_text()) // 2])
    paths = {"other-model": other, "corrupt": corrupt, "missing": tmp / "absent.json", "raises": policy}
    named = (
        [f"{name}={paths[name]}" for name in FAILURES]
        + [f"lof={policy}"]
        + [f"policy-load={loaded}", f"trace={tmp / 'trace.jsonl'}"]
    )
    env = {k: v for k, v in os.environ.items() if k not in (hook.POLICY_ENV, TRACE_ENV, "PYTHONPATH")}
    env[hook.POLICY_ENV] = str(policy)
    env[TRACE_ENV] = str(tmp / "trace.jsonl")  # set at start, so that the hook wraps run_batch
    env["PYTHONPATH"] = os.pathsep.join([str(ON_PYTHONPATH), str(REPO)])
    r = subprocess.run(
        [sys.executable, str(RUNNER), str(site), str(out), *RUNS, *named],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out.read_text()), r.stderr.splitlines(), {"policy": load(policy), "policy-load": load(loaded)}


def test_the_hook_puts_ppprofs_sizer_in_sglangs_own_scheduler(sglang_run):
    result, stderr, _ = sglang_run
    own = hook.SIZER_MODULE
    want = {"fixed": None, "greedy": own, "policy": "ppprof.sglang.sizer", "policy-load": "ppprof.sglang.sizer"}
    assert result["sizer"] == {run: want[run.split(":")[0]] for run in RUNS}, result["sizer"]
    replaced = [x for x in stderr if "is ppprof's policy sizer in this process" in x]
    assert len(replaced) == 1 and f"found {hook.BUILT_FOR}" in replaced[0], stderr[-20:]
    assert len(result["log"]) == len(RUNS) and all("matches this server" in x for x in result["log"]), result["log"]
    # get_new_batch_prefill wrapped (the policy's first chunk), SGLang's chunked_prefill_size (B) back after each batch
    assert result["first_chunk_wrapped"] is True
    assert {run: got["budget_after"] for run, got in result["runs"].items()} == {run: 512 for run in RUNS}


@pytest.mark.parametrize("run", RUNS)
def test_every_prompt_is_prefilled_once_in_order(sglang_run, run):
    got = sglang_run[0]["runs"][run]
    done = {rid: 0 for rid in got["prompts"]}
    for batch in got["batches"]:
        for rid, prefix, size in batch:
            assert prefix == done[rid] and size > 0, (rid, prefix, done[rid])
            done[rid] += size
    assert done == got["prompts"] and len(done) == REQUESTS


def test_the_pp_loop_serves_every_micro_batch_slot(sglang_run):
    """SGLang's init_pp_loop_state sizes the loop pp_size + pp_async_batch_depth, and the batches go to the slots in
    turn: while one slot's batch is in the pipeline the next slot's is formed, the chunked request's next chunk
    included."""
    for run, got in sglang_run[0]["runs"].items():
        depth = int(run.split(":")[2]) if run.count(":") == 2 else 0
        assert got["loop_size"] == PP_SIZE + depth, run
        assert set(got["slots"]) == set(range(PP_SIZE + depth)), run
    busy = sglang_run[0]["runs"]["policy:16"]["batches"]
    assert any(a[-1][0] == b[0][0] for a, b in zip(busy, busy[1:])), "no chunk followed its request's last"


@pytest.mark.parametrize("load", LOADS)
def test_sglangs_batches_carry_the_chunks_ppprofs_sizer_answered(sglang_run, load):
    """A batch that continues the chunked request at prefix L > 0 has the policy's chunk for (L, N) as its budget
    (SGLang's get_new_batch_prefill asks predict(L)); a batch with no chunked request has the policy's first chunk for
    the waiting queue's head, (0, N), as its budget (ppprof's hook gives it to SGLang's PrefillAdder; docs/sglang.md),
    not B."""
    policy = sglang_run[2]["policy"]
    run = sglang_run[0]["runs"][f"policy:{load}"]
    B = policy.settings.base_chunk_size
    continued = above_b = 0
    for batch in run["batches"]:
        rid, prefix, size = batch[0]
        total = sum(n for _, _, n in batch)
        n = run["prompts"][rid]
        budget = policy.next_chunk_size(prefix, n)  # the baseline has no under-load rule: no load read
        assert size == min(budget, n - prefix) and total <= budget, (batch, budget)
        assert total == budget or all(p + s == run["prompts"][r] for r, p, s in batch[:-1]), (batch, budget)
        continued += prefix > 0  # the chunked request: only it is partly prefilled
        above_b += prefix == 0 and size > B
    assert continued >= 3 and above_b >= 1, run["batches"]


@pytest.mark.parametrize("case", FAILURES)
def test_a_bad_policy_leaves_sglang_on_static_chunks_with_one_line(sglang_run, case):
    run = sglang_run[0]["failures"][case]
    B = sglang_run[2]["policy"].settings.base_chunk_size
    pieces = [size for batch in run["batches"] for _, _, size in batch]
    assert sum(pieces) == sum(run["prompts"].values()) and max(pieces) == B, run["batches"]
    assert all(sum(n for _, _, n in batch) <= B for batch in run["batches"]), run["batches"]
    if case == "raises":  # the policy loaded; its answer failed, said once, and SGLang kept B for every chunk
        assert run["sizer"] == "ppprof.sglang.sizer" and len(run["log"]) == 2, run["log"]
        assert "matches this server" in run["log"][0], run["log"]
        assert "the first chunk failed (RuntimeError('a policy that raises'))" in run["log"][1], run["log"]
    else:
        assert run["sizer"] is None and len(run["log"]) == 1, run["log"]
        assert f"refused, static chunks of {B}" in run["log"][0], run["log"]


def test_a_queue_order_other_than_fcfs_keeps_sglangs_first_chunk(sglang_run):
    """With SGLang's --schedule-policy lof (calc_priority may move another request to the head before it is
    admitted) the hook leaves the first chunk at B; predict still sizes the later chunks by the policy."""
    run = sglang_run[0]["failures"]["lof"]
    policy = sglang_run[2]["policy"]
    B = policy.settings.base_chunk_size
    assert run["sizer"] == "ppprof.sglang.sizer" and len(run["log"]) == 1, run["log"]
    first, second = run["batches"][:2]
    assert first[0][1:] == [0, B] and second[0][1:] == [B, policy.next_chunk_size(B, PROMPTS[0])], run["batches"]


def arm_policy(sglang_run, arm: str):
    """The policy each arm's sizer answers from in ppprof.serving: the greedy arm's model is the quadratic SGLang's
    own predictor fitted (its start-up fit of the policy's prefix-free curve), its target f(B) - f(0)."""
    policy = sglang_run[2]["policy-load" if arm == "policy-load" else "policy"]
    if arm != "greedy":
        return policy
    a, b, c = sglang_run[0]["greedy_fit"]
    B = policy.base_chunk_size
    data = policy.data | {"target_latency_ms": a * B * B + b * B}
    return dataclasses.replace(policy, latency_model=LatencyModel("quadratic", a=a, b=b, c=c), data=data)


def simulated(sglang_run, run: str, sizer=None):
    """`run`'s arrivals through ppprof.serving.simulate.serve: the same prompts, pp size, async depth, arrivals and
    clock (the policy's planning model, stage by stage), pools that never run short; its batches as SGLang's
    [rid, prefix, size] lists, and their slots."""
    arm, load, *depth = run.split(":")
    policy = arm_policy(sglang_run, arm)
    level = (
        LoadLevel(rate=float(load[len("rate-") :])) if load.startswith("rate-") else LoadLevel(concurrency=int(load))
    )
    name = load if load.startswith("rate-") else f"c{load}"
    stage_ms = stage_clock(sglang_run[2]["policy"])
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(REQUESTS)]
    served = serve(
        PP_SIZE,
        sizer or arms.sizer(policy, arm),
        lambda batch: stage_ms([[p.rid, p.prefix_len, p.size] for p in batch.pieces]),
        Capacity(10**9, 10**6),
        Arrivals(prompts, level),
        int(depth[0]) if depth else 0,
    )
    batches = [[[f"{name}-r{p.rid}", p.prefix_len, p.size] for p in b.pieces] for b, _, _ in served.batches]
    return batches, [b.slot for b, _, _ in served.batches]


@pytest.mark.parametrize("run", RUNS)
def test_the_simulator_forms_sglangs_batches(sglang_run, run):
    """ppprof.serving's scheduler and pipeline, beside SGLang's PP loop: every batch equal, in order and slot, for
    every arm and load (SGLang's own greedy first chunk of B held by arms.FIRST_CHUNK_B_ARMS, the policy arms' first
    chunk their rule's, as ppprof's hook makes SGLang take it)."""
    got = sglang_run[0]["runs"][run]
    batches, slots = simulated(sglang_run, run)
    first = next((i for i, (a, b) in enumerate(zip(got["batches"], batches)) if a != b), None)
    assert first is None and len(batches) == len(got["batches"]), (run, first, len(batches), len(got["batches"]))
    assert slots == got["slots"], run


def test_the_arms_differ_and_the_policys_first_chunk_shows(sglang_run):
    """The arms are not one: each forms other batches at concurrency 16. The simulator's rule while SGLang took B as
    every first chunk (the hook did not give it the policy's) parts from SGLang at the first batch: SGLang's first
    batch is the policy's first chunk of the 9000-token prompt, 1792 tokens, not B."""
    runs = sglang_run[0]["runs"]
    streams = {arm: json.dumps(runs[f"{arm}:16"]["batches"]) for arm in ARMS}
    assert len(set(streams.values())) == len(ARMS), "two arms formed the same batches"
    policy = sglang_run[2]["policy"]
    B, rule = policy.base_chunk_size, arms.arm_rule(policy, "policy")
    old, _ = simulated(sglang_run, "policy:1", lambda prefix, n, load: B if prefix == 0 else rule(prefix, n, load))
    first = runs["policy:1"]["batches"][0][0]
    assert old[0] != runs["policy:1"]["batches"][0] and first[2] == policy.next_chunk_size(0, PROMPTS[0]) > B


def test_each_pp_rank_traces_its_prefill_forwards(sglang_run, tmp_path):
    """PPPROF_TRACE: each PP rank's run_batch wrote its prefill forwards into its part (PATH.rank<r>), each piece's
    prefix and extend lengths from SGLang's batch; the parts read back as one trace with ppprof's reader, of the
    policy's model and layout (what `ppprof calibrate` checks first). Runs with PPPROF_TRACE unset wrote nothing."""
    result = sglang_run[0]
    parts = result["traces"]
    assert [p.rsplit(".", 1)[1] for p in parts] == ["rank0", "rank1"], parts
    forwards = read_forwards(parts)
    head = forwards.header
    assert head["server"] == "sglang" and head["server_version"] == hook.BUILT_FOR, head
    assert (head["pp_size"], head["tp_size"], head["clock"], head["device"], head["dtype"]) == (
        2,
        1,
        "perf_counter",
        "cpu",
        "bfloat16",
    ), head
    assert sorted(set(forwards.stage)) == [0, 1] and len(forwards) % 2 == 0
    half = len(forwards) // 2
    assert forwards.pieces[:half] == forwards.pieces[half:]  # every rank's scheduler forms the same batches
    assert all(f["dropped_by_writer"] == 0 for f in forwards.files)
    policy = sglang_run[2]["policy"]
    assert sum(x for pieces in forwards.pieces[:half] for _, x in pieces) == sum(PROMPTS)
    check_match(policy.data, forwards, "policy.json", parts[0])
    assert not result["trace_log"], result["trace_log"]
