"""The under-load rule `ppprof fit` chooses for robustness (ppprof.serving.underload) and the `policy-load` arm that
feeds it the scheduler's load: the candidate kept is the one never worse than the idle rules beyond the noise whose
worst loss over the family of workloads and levels is least (its evidence recomputed exactly), none where no
candidate beats the idle rules; alone in the pipeline the arm runs the policy's chunks; and on models and workloads
the fit never saw (the issue's 8-stage pipeline, and a model and workload drawn here) policy-load is within 2% of the
best arm's throughput and mean TTFT and never more than 1% below `policy`, at every closed-loop level up to 2 x the
stages and at Poisson loads."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ppprof.config import PolicyOptions
from ppprof.fit import fit
from ppprof.fit.build import with_load
from ppprof.policy import SCHEMA_VERSION, from_dict, load, validate
from ppprof.policy.rule import LatencyModel
from ppprof.policy.runtime import flattened, nested
from ppprof.policy.tables import LoadRule
from ppprof.serving.arms import SERVING_ARMS, packed_stage_ms, sizer
from ppprof.serving.scheduler import Capacity
from ppprof.serving.simulate import Arrivals, LoadLevel, prompts_of, serve
from ppprof.serving.underload import (
    NOISE,
    candidates,
    cells,
    choose_load,
    robust_choice,
    scored_rules,
    served,
    worst_losses,
)

from ..policy.policy_helpers import policy_dict

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests/runs/tiny-hybrid"
REFERENCE = REPO / "results/bench-reference/profile"
"""The default profile (docs/bench.md's serve-bench example): its samples refitted here, with the under-load rule."""
GOAL, FLOOR = 0.02, 0.01
"""policy-load within 2% of the best arm's throughput and mean TTFT, and never more than 1% below policy's."""


def refit(folder: Path, tmp: Path, min_gain: float | None = None):
    for name in ("samples.csv", "run.json"):
        shutil.copy(folder / name, tmp / name)
    return load(fit(tmp / "samples.csv", policy_options={"min_gain": min_gain})[0])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return refit(TINY, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Refitted with --min-gain 0.01: its predicted gain (2.05%) has a lower bound of 1.96% over resampled fits, so
    the default 2% gives a static policy, and the under-load rule is tested on the dynamic rules it refines."""
    policy = refit(REFERENCE, tmp_path_factory.mktemp("reference"), min_gain=0.01)
    assert policy.status == "dynamic", policy.reason
    return policy


def chosen_for(model: LatencyModel, pp_size: int, **settings):
    """A policy of `model` at `pp_size` stages, its rules chosen as `ppprof fit` chooses them, then its under-load
    rule."""
    data = flattened(policy_dict(model, pp_size=pp_size, **settings)) | {"diagnostics": {}}
    return from_dict(nested(with_load(data, PolicyOptions())))


@pytest.fixture(scope="module")
def eight_stage():
    """Issue 48's 8-stage GPU-sized pipeline: t = c + gL + bx + a(2Lx + x^2), a 1.1e-7, b 2.4e-3, c 9.0, g 3.1e-4 ms,
    B 16384, page 64, chunks up to 65536; its rules planned for prompts up to 131072 rather than the issue's context
    of 524288 (the prompts served are 98304 tokens; the larger domain costs a minute of planning, not a different
    rule for them). scripts/experiments/robust_load.py serves the issue's own fitted policy at the full context."""
    model = LatencyModel("prefix", a=1.1e-7, b=2.4e-3, c=9.0, g=3.1e-4)
    return chosen_for(model, 8, base_chunk_size=16384, context_len=131072, largest=65536)


def served_at(policy, arm: str, prompts: list[int], level: LoadLevel):
    stage_ms = packed_stage_ms(policy.planning_model, policy.pp_size, policy.extra_piece_ms)
    entries = level.concurrency or 128
    capacity = Capacity(max(prompts) * entries, entries)
    return serve(policy.pp_size, sizer(policy, arm), stage_ms, capacity, Arrivals(prompts, level)).summary()


def goal_misses(policy, prompts: list[int], levels: list[LoadLevel]) -> list[str]:
    """Each level where policy-load is further than GOAL from the best arm or FLOOR below policy, in words."""
    misses = []
    for level in levels:
        rows = {arm: served_at(policy, arm, prompts, level) for arm in SERVING_ARMS}
        best_throughput = max(r["throughput_tokens_per_s"] for r in rows.values())
        best_ttft = min(r["ttft_ms"]["mean"] for r in rows.values())
        mine, idle = rows["policy-load"], rows["policy"]
        throughput, ttft = mine["throughput_tokens_per_s"], mine["ttft_ms"]["mean"]
        if (
            throughput < (1 - GOAL) * best_throughput
            or ttft > (1 + GOAL) * best_ttft
            or throughput < (1 - FLOOR) * idle["throughput_tokens_per_s"]
            or ttft > (1 + FLOOR) * idle["ttft_ms"]["mean"]
        ):
            misses.append(
                f"{level.name}: throughput {throughput / best_throughput:.3f} of the best, "
                f"{throughput / idle['throughput_tokens_per_s']:.3f} of policy; mean TTFT {ttft / best_ttft:.3f} of "
                f"the best, {ttft / idle['ttft_ms']['mean']:.3f} of policy"
            )
    return misses


def every_level(policy, prompts: list[int]) -> list[LoadLevel]:
    """Closed loops of 1 to 2 x the stages (1, 2, 3 and the stages' half, whole, one and a half, double) and
    Poisson arrivals at 50, 80 and 95% of fixed-best's throughput at concurrency pp_size."""
    pp = policy.pp_size
    closed = sorted({1, 2, 3, *(max(1, round(pp * f)) for f in (0.5, 1.0, 1.5, 2.0))})
    top = served_at(policy, "fixed-best", prompts, LoadLevel(concurrency=pp))["throughput_tokens_per_s"]
    rate = top / float(np.mean(prompts))
    return [LoadLevel(concurrency=c) for c in closed] + [LoadLevel(rate=f * rate) for f in (0.5, 0.8, 0.95)]


def test_candidates_are_units_from_the_smaller_fixed_chunk_to_the_largest_chunk(reference):
    sizes = candidates(reference)
    unit, top = reference.data["prompt_table"]["unit"], reference.prompt_rule.largest_chunk
    assert sizes == sorted(set(sizes)) and all(x % unit == 0 for x in sizes)
    assert {reference.base_chunk_size, reference.fixed_best_chunk} <= set(sizes) and sizes[-1] == top
    assert sizes[0] == min(reference.base_chunk_size, reference.fixed_best_chunk)


def figures(throughput_ttft: list[tuple[float, float]]):
    return [(float(t), float(m)) for t, m in throughput_ttft]


def test_the_robust_choice_keeps_the_least_worst_loss_never_worse_than_idle_beyond_the_noise():
    rule = [LoadRule(2, f, 64, 10.0, 1024) for f in (2.0, 3.0, 4.0)]
    idle = figures([(100, 10), (100, 20)])
    best_but_one_bad_cell = figures([(140, 7), (100 * (1 - 2 * NOISE), 20)])  # least worst loss, 2% short once
    steady = figures([(130, 8), (100, 20)])
    weaker = figures([(120, 9), (100, 20)])
    scored = [(None, idle), (rule[0], best_but_one_bad_cell), (rule[1], weaker), (rule[2], steady)]
    assert worst_losses(scored)[1] < worst_losses(scored)[3] < worst_losses(scored)[2]
    assert robust_choice(scored) == 3
    assert robust_choice(scored[:2]) == 0  # the only candidate beyond the noise: the idle rules
    worse = figures([(99.5, 10.04), (100, 20)])  # within the noise but no better anywhere: idle
    assert robust_choice([(None, idle), (rule[0], worse)]) == 0


@pytest.mark.parametrize("which", ["tiny", "reference"])
def test_the_fit_carries_the_robust_choice_and_its_evidence(which, request):
    policy = request.getfixturevalue(which)
    data = policy.data
    assert data["schema_version"] == SCHEMA_VERSION == 6, data.get("reason")
    idle = dataclasses.replace(policy, load_rule=None)
    family = cells(idle, 0)
    scored = scored_rules(idle, family)
    chosen = robust_choice(scored)
    assert policy.load_rule == scored[chosen][0]
    evidence = policy.report.diagnostics["under_load"]
    assert (
        evidence["worst_loss"] == worst_losses(scored)[chosen]
        and evidence["idle_worst_loss"] == worst_losses(scored)[0]
    )
    names = {c.workload for c in family}
    assert len(names) >= 6 and {"policy's workload", "long-tailed mix"} <= names
    closed = [c.level.concurrency for c in family if c.workload == "policy's workload" and c.level.concurrency]
    assert max(closed) == 2 * policy.pp_size and any(c.level.rate for c in family)
    for cell, row in list(zip(family, evidence["cells"]))[:: max(1, len(family) // 6)]:  # the file's figures, again
        assert row["workload"] == cell.workload and row["level"] == cell.level.name
        mine = served(idle, policy.load_rule, cell, 0)
        assert (
            row["throughput_tokens_per_s"]["policy-load"] == mine[0] and row["ttft_mean_ms"]["policy-load"] == mine[1]
        )
        assert row["ttft_mean_ms"]["policy"] == served(idle, None, cell, 0)[1]
    line = validate(policy)
    if policy.load_rule is None:
        assert "; no under-load rule: no candidate beat the idle rules robustly" in line
    else:
        assert f"(chosen for its worst loss {evidence['worst_loss']:.1%}, at {evidence['worst_at']};" in line


@pytest.mark.parametrize("which", ["tiny", "reference"])
def test_alone_policy_load_runs_the_policy_chunk_for_chunk(which, request):
    policy = request.getfixturevalue(which)
    workload = policy.report.workload
    prompts = prompts_of(workload["prompt_lens"], workload["weights"], 16, 3)
    one = served_at(policy, "policy-load", prompts, LoadLevel(concurrency=1))
    other = served_at(policy, "policy", prompts, LoadLevel(concurrency=1))
    assert (
        one["ttft_ms_by_request"] == other["ttft_ms_by_request"]
        and one["chunks_per_request"] == other["chunks_per_request"]
    )


def test_without_a_model_there_is_nothing_to_simulate(tiny):
    assert choose_load(dataclasses.replace(tiny, planning_model=None)) == (None, {})


def test_the_rule_is_chosen_at_the_servers_async_depth():
    """`ppprof fit --async-depth 3`: the levels are served with 3 slots beyond the stages, the rule's slots say so."""
    committed = json.loads((TINY / "policy.json").read_text())  # schema 3: flattened reads it in the fit's form
    data = flattened(committed) | {"diagnostics": {}, "schema_version": SCHEMA_VERSION}
    deep = from_dict(nested(with_load(data, PolicyOptions(async_depth=3))))
    evidence = deep.report.diagnostics["under_load"]
    assert evidence["async_depth"] == 3 and evidence["slots"] == deep.pp_size + 3
    assert deep.load_rule is None or deep.load_rule.slots == deep.pp_size + 3
    closed = [row["level"] for row in evidence["cells"] if row["level"].startswith("concurrency-")]
    assert f"concurrency-{2 * (deep.pp_size + 3)}" in closed


def test_issue_48_eight_stages_at_98304_tokens(eight_stage):
    """The issue's table: 98304-token prompts, 48 a level, closed loops of 1 to 16 and Poisson loads; the old rule
    lost 35% of policy's throughput at concurrency 4. With the policy's own first chunk (as ppprof's hook gives it to
    SGLang) the rule chosen meets the goal at every level; with SGLang's first chunk of B it missed at concurrency 4
    (3.1% below policy's throughput; docs/results.md, robust-load)."""
    prompts = [98304] * 48
    assert goal_misses(eight_stage, prompts, every_level(eight_stage, prompts)) == []


def test_a_model_and_workload_the_fit_never_saw(tmp_path):
    """Coefficients, stages and a workload drawn here (seeded): a GPU-sized prefix model at 4-12 stages, a mix of
    3 prompt lengths up to the context; policy-load within the goal at every level."""
    rng = np.random.default_rng(48)
    model = LatencyModel(
        "prefix",
        a=float(rng.uniform(0.5e-7, 4e-7)),
        b=float(rng.uniform(1e-3, 8e-3)),
        c=float(rng.uniform(5.0, 30.0)),
        g=float(rng.uniform(1e-4, 6e-4)),
    )
    pp_size = int(rng.integers(4, 13))
    policy = chosen_for(model, pp_size, base_chunk_size=8192, context_len=131072, largest=32768)
    lengths = sorted(int(n) // 64 * 64 for n in rng.uniform(4096, 131072, size=3))
    prompts = prompts_of(lengths, list(rng.dirichlet(np.ones(3))), 48, 7)
    misses = goal_misses(policy, prompts, every_level(policy, prompts))
    assert misses == [], f"{model=} {pp_size=} {lengths=}"
