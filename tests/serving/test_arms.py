"""The serving bench's arms as sizers: alone in the pipeline each gives the chunks of its one-prompt plan (what
`ppprof plan` and `ppprof bench` run; SGLang's own greedy rule starts at B, as SGLang does, and ppprof's policy arms
at their rule's first chunk, as ppprof's hook makes SGLang take it); atom-guard falls back to B when other requests wait, policy-load asks the
policy's under-load rule with the scheduler's load, and a packed forward pays one fixed cost (and the cost of each
extra piece the profile's packed forwards measured)."""

import dataclasses
import math
from pathlib import Path

import pytest

from ppprof.policy import load
from ppprof.policy.planners import fixed_chunks
from ppprof.policy.tables import LoadRule
from ppprof.serving.arms import SERVING_ARMS, packed_stage_ms, sizer
from ppprof.serving.scheduler import Batch, Capacity, Load, Piece
from ppprof.serving.simulate import Arrivals, LoadLevel, serve

POLICY = Path(__file__).resolve().parents[1] / "runs/tiny-hybrid/policy.json"


@pytest.fixture(scope="module")
def policy():
    return load(POLICY)


@pytest.mark.parametrize("arm", SERVING_ARMS)
def test_alone_each_arm_runs_its_one_prompt_plan(policy, arm):
    prompts = [700, 2000, 4000]
    stage_ms = packed_stage_ms(policy.planning_model, 2)
    served = serve(2, sizer(policy, arm), stage_ms, Capacity(100_000, 8), Arrivals(prompts, LoadLevel(concurrency=1)))
    B = policy.base_chunk_size
    best = policy.report.predicted["fixed_best_chunk"]
    for r in served.requests:
        want = {
            "fixed": fixed_chunks(B, r.prompt_len),
            "fixed-best": fixed_chunks(best, r.prompt_len),
            "greedy": policy.sglang_plan(r.prompt_len),
            "policy": policy.plan(r.prompt_len),
            "policy-history": policy.plan_history(r.prompt_len),
            "atom-guard": policy.plan(r.prompt_len),
            "policy-load": policy.plan(r.prompt_len),
        }[arm]
        assert r.chunks == want, (arm, r.prompt_len)


def test_atom_guard_is_fixed_while_others_wait(policy):
    guard = sizer(policy, "atom-guard")
    assert guard(1000, 4000, Load()) == policy.next_chunk_size(1000, 4000)
    assert guard(1000, 4000, Load(pending_requests=1, pending_tokens=3000)) == policy.base_chunk_size


def test_policy_load_feeds_the_scheduler_load_to_the_under_load_rule(policy):
    # chunks up to 640 tokens once the work fills 4 x 2 slots with chunks longer than the idle one
    loaded = dataclasses.replace(policy, load_rule=LoadRule(2, 4.0, 64, math.inf, 640))
    arm = sizer(loaded, "policy-load")
    idle = policy.next_chunk_size(1000, 4000)
    assert idle < 640
    assert arm(1000, 4000, Load()) == idle == sizer(policy, "policy-load")(1000, 4000, Load(5, 9000))
    assert arm(1000, 4000, Load(pending_requests=1, pending_tokens=1)) == idle  # 4001 tokens: short of the idle chunk
    full = arm(1000, 4000, Load(pending_requests=2, pending_tokens=9000, busy_slots=1))
    assert full == loaded.next_chunk_size(1000, 4000, pending_requests=2, pending_tokens=9000)
    assert idle < full <= 640


def test_a_packed_forward_pays_one_fixed_cost(policy):
    model = policy.planning_model
    one = [float(model.chunk_latency_ms(L, x)) for L, x in ((0, 256), (1024, 128))]
    batch = Batch(0, (Piece(0, 0, 256, last=False), Piece(1, 1024, 128, last=True)))
    assert packed_stage_ms(model, 3)(batch) == pytest.approx([sum(one) - model.c] * 3)


def test_a_packed_forward_pays_the_cost_of_each_extra_piece_its_policy_measured(policy):
    model = policy.planning_model
    variable = [float(model.chunk_latency_ms(L, x)) - model.c for L, x in ((0, 256), (1024, 128), (0, 64))]
    batch = Batch(0, (Piece(0, 0, 256, last=False), Piece(1, 1024, 128, last=True), Piece(2, 0, 64, last=True)))
    assert policy.extra_piece_ms == 0.0  # the committed run timed no packed forwards: the additive form
    assert packed_stage_ms(model, 2, 1.5)(batch) == pytest.approx([model.c + sum(variable) + 2 * 1.5] * 2)
    one = Batch(1, (Piece(3, 0, 256, last=True),))
    assert packed_stage_ms(model, 2, 1.5)(one) == pytest.approx([float(model.chunk_latency_ms(0, 256))] * 2)


def test_an_unknown_arm_is_named(policy):
    with pytest.raises(ValueError, match="--strategies 'best' is unknown"):
        sizer(policy, "best")
