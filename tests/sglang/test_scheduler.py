"""SGLang 0.5.23's own scheduler forms the batches on a CPU, with ppprof's sizer put in place by the start-up hook as
`python -m ppprof.sglang` puts it (PPPROF_POLICY set, the hook's sitecustomize first on PYTHONPATH): one fresh
interpreter a session (tests/sglang/scheduler_run.py) runs closed loops of 1, 4 and 16 clients and Poisson arrivals
through SGLang's waiting queue, PrefillAdder and get_new_batch_prefill, and a loop for each bad policy; the tests read
every batch it formed. Skipped, with pip's reason, where SGLang's CPU install (tests/sglang/cpu_install.py) cannot be
had."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ppprof.policy import load
from ppprof.serving import arms
from ppprof.serving.scheduler import Capacity, Request, Scheduler
from ppprof.sglang import hook

from .cpu_install import installed
from .scheduler_run import PROMPTS, REQUESTS, arrivals, batch_ms
from .standin import REPO, shaped

BASELINE = REPO / "results" / "baseline" / "policy.json"
RUNNER = REPO / "tests" / "sglang" / "scheduler_run.py"
ON_PYTHONPATH = REPO / "ppprof" / "sglang" / "on-pythonpath"
LOADS = ("1", "4", "16", "rate-10")
"""Closed loops of 1, 4 and 16 clients, and Poisson arrivals at 10 requests a second."""
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
    out = tmp / "batches.json"
    other = shaped(BASELINE, tmp / "other", **{"provenance.model_shape.hidden_size": 128})
    corrupt = tmp / "corrupt.json"
    corrupt.write_text(policy.read_text()[: len(policy.read_text()) // 2])
    paths = {"other-model": other, "corrupt": corrupt, "missing": tmp / "absent.json", "raises": policy}
    cases = [f"{name}={paths[name]}" for name in FAILURES]
    env = {k: v for k, v in os.environ.items() if k not in (hook.POLICY_ENV, "PYTHONPATH")}
    env[hook.POLICY_ENV] = str(policy)
    env["PYTHONPATH"] = os.pathsep.join([str(ON_PYTHONPATH), str(REPO)])
    r = subprocess.run(
        [sys.executable, str(RUNNER), str(site), str(out), *LOADS, *cases],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out.read_text()), r.stderr.splitlines(), load(policy)


def test_the_hook_puts_ppprofs_sizer_in_sglangs_own_scheduler(sglang_run):
    result, stderr, _ = sglang_run
    assert result["sizer"] == ["ppprof.sglang.sizer"], result["sizer"]
    replaced = [x for x in stderr if "is ppprof's policy sizer in this process" in x]
    assert len(replaced) == 1 and f"found {hook.BUILT_FOR}" in replaced[0], stderr[-20:]
    assert len(result["log"]) == len(LOADS) and all("matches this server" in x for x in result["log"]), result["log"]


@pytest.mark.parametrize("load", LOADS)
def test_every_prompt_is_prefilled_once_in_order(sglang_run, load):
    run = sglang_run[0]["runs"][load]
    done = {rid: 0 for rid in run["prompts"]}
    for batch in run["batches"]:
        for rid, prefix, size in batch:
            assert prefix == done[rid] and size > 0, (rid, prefix, done[rid])
            done[rid] += size
    assert done == run["prompts"]


@pytest.mark.parametrize("load", LOADS)
def test_sglangs_batches_carry_the_chunks_ppprofs_sizer_answered(sglang_run, load):
    """A batch that continues the chunked request at prefix L > 0 has the policy's chunk for (L, N) as its budget
    (SGLang's get_new_batch_prefill asks predict(L)); the first batch of a busy spell has B, SGLang's own first chunk
    (docs/sglang.md)."""
    _, _, policy = sglang_run
    run = sglang_run[0]["runs"][load]
    B = policy.settings.base_chunk_size
    continued = 0
    for i, batch in enumerate(run["batches"]):
        rid, prefix, size = batch[0]
        total = sum(n for _, _, n in batch)
        n = run["prompts"][rid]
        if i > 0 and prefix > 0 and run["batches"][i - 1][-1][0] == rid:  # the request chunked in the batch before
            budget = policy.next_chunk_size(prefix, n)
            assert size == min(budget, n - prefix) and total <= budget, (batch, budget)
            assert total == budget or all(p + s == run["prompts"][r] for r, p, s in batch[:-1]), (batch, budget)
            continued += 1
        else:
            assert total <= B, (batch, B)
    assert continued >= 3, run["batches"]


@pytest.mark.parametrize("case", FAILURES)
def test_a_bad_policy_leaves_sglang_on_static_chunks_with_one_line(sglang_run, case):
    run = sglang_run[0]["failures"][case]
    B = sglang_run[2].settings.base_chunk_size
    pieces = [size for batch in run["batches"] for _, _, size in batch]
    assert sum(pieces) == sum(run["prompts"].values()) and max(pieces) == B, run["batches"]
    assert all(sum(n for _, _, n in batch) <= B for batch in run["batches"]), run["batches"]
    if case == "raises":  # the policy loaded; its answer failed, said once, and SGLang kept B for every chunk
        assert run["sizer"] == "ppprof.sglang.sizer" and len(run["log"]) == 2, run["log"]
        assert "matches this server" in run["log"][0], run["log"]
        assert "predict(512) failed (RuntimeError('a policy that raises'))" in run["log"][1], run["log"]
    else:
        assert run["sizer"] is None and len(run["log"]) == 1, run["log"]
        assert f"refused, static chunks of {B}" in run["log"][0], run["log"]
    print(case, run["log"][-1])


def simulated(policy, load: str, sizer) -> list[list[list]]:
    """The load SGLang ran (scheduler_run.run_load: the same prompts, arrivals and clock, each batch formed after the
    last one's result) through ppprof.serving's scheduler: one micro-batch slot, pools that never run short."""
    sched = Scheduler(1, sizer, Capacity(10**9, 10**6))
    times, clock = arrivals(load), batch_ms(policy)
    name = load if times is not None else f"c{load}"
    sent: list[int] = []

    def send():
        sent.append(PROMPTS[len(sent) % len(PROMPTS)])
        sched.arrive(Request(len(sent) - 1, sent[-1], 0.0))

    now = 0.0
    if times is None:
        for _ in range(min(int(load), REQUESTS)):
            send()
    batches = []
    while len(sent) < REQUESTS or not sched.idle:
        if times is not None:
            if sched.idle:
                now = max(now, times[len(sent)])
            while len(sent) < REQUESTS and times[len(sent)] <= now:
                send()
        batch = sched.next_batch(0)
        batches.append([[f"{name}-r{p.rid}", p.prefix_len, p.size] for p in batch.pieces])
        now += clock(batches[-1])
        for _ in sched.finish(0, now):
            if times is None and len(sent) < REQUESTS:
                send()
    return batches


@pytest.mark.parametrize("load", LOADS)
def test_the_simulator_forms_sglangs_batches_but_for_sglangs_first_chunk(sglang_run, load):
    """ppprof.serving's scheduler with the `policy` arm, beside SGLang's batches: they differ where a batch is formed
    with no request partly prefilled, which SGLang sizes at B without asking the sizer (docs/sglang.md), and the
    streams part there. With that one rule given to the simulator's sizer, every batch is SGLang's."""
    _, _, policy = sglang_run
    sglang = sglang_run[0]["runs"][load]["batches"]
    as_simulated = simulated(policy, load, arms.sizer(policy, "policy"))
    prompts = sglang_run[0]["runs"][load]["prompts"]
    first = next((i for i, (a, b) in enumerate(zip(sglang, as_simulated)) if a != b), None)
    assert first is not None, "SGLang's first chunk of B does not show"
    rid, prefix, _ = sglang[first][0]
    B = policy.base_chunk_size
    assert prefix == 0 and sum(n for _, _, n in sglang[first]) == B, sglang[first]
    assert sum(n for _, _, n in as_simulated[first]) == policy.next_chunk_size(0, prompts[rid]) != B, as_simulated[
        first
    ]

    def sglang_first_chunk(prefix_len, prompt_len, load):
        return policy.base_chunk_size if prefix_len == 0 else policy.next_chunk_size(prefix_len, prompt_len)

    assert simulated(policy, load, sglang_first_chunk) == sglang
