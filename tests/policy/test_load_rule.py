"""The under-load rule (policy.json's `load`, schema 5): Policy.next_chunk_size with the scheduler's load answers as
with none while nothing else waits or the work present would not fill the pipeline's slots (and always without a
rule: schema 3 policies, and schema 4 ones whose pending-count rule is kept but not read), and the full pipeline's
chunk of one latency once it would; the file's `load` is checked (its form for its schema, bounds, the unit and the
profiled domain) and `validate` says what it holds."""

import copy
import json
import math
from pathlib import Path

import pytest

from ppprof.policy import from_dict, load, validate
from ppprof.policy.tables import LoadRule

TINY = Path(__file__).resolve().parents[1] / "runs/tiny-hybrid/policy.json"
RULE = {"slots": 4, "fill": 2.0, "unit": 64, "full": {"bound_ms": 12.0, "chunk_cap": 1024}}
"""The work over 2 x 4 slots; chunks of at most 12 ms predicted and 1024 tokens while the pipeline is full."""
SCHEMA_4_RULE = {
    "pending_requests": [1],
    "bound_ms": [None],
    "chunk_cap": [512],
    "prefix_len": [[0]],
    "chunk_size": [[512]],
    "handover_tokens": 0,
}


def with_rule(rule: dict | None = None, version: int = 5) -> dict:
    data = json.loads(TINY.read_text())
    data["schema_version"] = version
    data["load"] = copy.deepcopy(rule or RULE)
    return data


def every_ask(policy):
    """(prefix_len, prompt_len) of every chunk of every prompt's plan up to the longest of the domain, and the
    history-only asks (prompt_len None)."""
    for n in range(1, policy.prompt_rule.largest_chunk + 2, 7):
        done = 0
        for x in policy.plan(n):
            yield done, n
            yield done, None
            done += x


def reference_chunk(policy, prefix_len: int, prompt_len: int, pending_tokens: int, slots: int = 4) -> int:
    """The rule as the schema words it, by brute force over the aligned chunks."""
    model, idle = policy.planning_model, policy.next_chunk_size(prefix_len, prompt_len)
    share = max(64, int((prompt_len + pending_tokens) / (2.0 * slots)) // 64 * 64)
    bound = min(12.0, model.one_chunk_ms(0, share))
    if bound <= model.one_chunk_ms(prefix_len, idle):
        return idle
    fits = [x for x in range(64, 1024 + 1, 64) if model.one_chunk_ms(prefix_len, x) <= bound]
    return max(idle, max(fits, default=64))


@pytest.mark.parametrize("version, rule", [(3, None), (4, SCHEMA_4_RULE)])
def test_without_a_schema_5_rule_every_load_answers_as_none(version, rule):
    """Schema 3 has no rule; schema 4's pending-count rule is kept in the file but not read."""
    today = load(TINY)
    policy = today if rule is None else from_dict(with_rule(rule, version))
    assert policy.data["schema_version"] == version and policy.load_rule is None
    for L, n in every_ask(today):
        want = today.next_chunk_size(L, n)
        assert policy.next_chunk_size(L, n, pending_requests=0, pending_tokens=0) == want
        assert policy.next_chunk_size(L, n, pending_requests=5, pending_tokens=10**6) == want, f"{L=} {n=}"


def test_alone_a_schema_5_policy_answers_chunk_for_chunk_as_with_no_rule():
    today, loaded = load(TINY), from_dict(with_rule())
    assert loaded.load_rule == LoadRule(4, 2.0, 64, 12.0, 1024)
    for L, n in every_ask(today):
        want = today.next_chunk_size(L, n)
        assert loaded.next_chunk_size(L, n) == want, f"{L=} {n=}"
        assert loaded.next_chunk_size(L, n, pending_requests=3, pending_tokens=0) == want, f"{L=} {n=}"
    for n in (100, 700, 1025):
        assert loaded.plan(n) == today.plan(n) and loaded.plan_at_load(n) == today.plan(n)


@pytest.mark.parametrize("pending_tokens", [1, 500, 3000, 8000, 40000, 10**6])
def test_under_load_the_chunk_is_the_rules_wording(pending_tokens):
    policy = from_dict(with_rule())
    for prefix_len in (0, 300, 700, 1024, 3000):
        n = prefix_len + 900
        want = reference_chunk(policy, prefix_len, n, pending_tokens)
        got = policy.next_chunk_size(prefix_len, n, pending_requests=2, pending_tokens=pending_tokens)
        assert got == want, f"{prefix_len=} {pending_tokens=}"


def test_the_pipeline_fills_with_the_work_and_empties_with_the_slots():
    policy = from_dict(with_rule())
    idle = policy.next_chunk_size(700, 1600)
    little = policy.next_chunk_size(700, 1600, pending_requests=1, pending_tokens=500)
    much = policy.next_chunk_size(700, 1600, pending_requests=9, pending_tokens=10**6)
    assert little == idle < much <= 1024, f"{idle=} {little=} {much=}"
    assert policy.next_chunk_size(700, 1600, pending_requests=9, pending_tokens=10**6, slots=10**5) == idle
    # the bound holds whatever the load: no chunk past 12 ms predicted beyond the idle one
    assert policy.planning_model.one_chunk_ms(700, much) <= 12.0
    assert policy.plan_at_load(4000, pending_requests=9, pending_tokens=10**6) != policy.plan(4000)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"pending_requests": -1}, ValueError, "a load is never negative"),
        ({"pending_tokens": -5}, ValueError, "a load is never negative"),
        ({"pending_requests": 1.5}, TypeError, "pending_requests must be an integer"),
        ({"pending_requests": True}, TypeError, "pending_requests must be an integer"),
        ({"pending_tokens": 9, "slots": 0}, ValueError, "give the server's micro-batch slots"),
    ],
)
def test_a_bad_load_is_refused_in_one_line(kwargs, error, message):
    with pytest.raises(error, match=message):
        from_dict(with_rule()).next_chunk_size(300, 900, **kwargs)


def test_numpy_counts_are_taken():
    np = pytest.importorskip("numpy")
    policy = from_dict(with_rule())
    want = policy.next_chunk_size(300, 900, pending_requests=3, pending_tokens=10**6)
    assert policy.next_chunk_size(300, 900, pending_requests=np.int64(3), pending_tokens=np.int64(10**6)) == want


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema_version=3), r"\$\.load: the under-load rule is a schema 4 field"),
        (lambda d: d.update(schema_version=4), r"\$\.load: schema 5's \(slots, fill\) under-load rule in a schema 4"),
        (lambda d: d.update(load=copy.deepcopy(SCHEMA_4_RULE)), r"\$\.load: schema 4's \(pending_requests\) under-"),
        (lambda d: d["load"].update(fill=0), r"\$\.load"),
        (lambda d: d["load"].update(fill=1e4), r"\$\.load\.fill: 10000(\.0)? is outside 0\.\.1000"),
        (lambda d: d["load"].update(slots=2**60), r"\$\.load\.slots: .* is outside"),
        (lambda d: d["load"].pop("full"), r"\$\.load"),
        (lambda d: d["load"].update(unit=128), r"\$\.load\.unit: 128 is not prompt_table\.unit 64"),
        (lambda d: d["load"]["full"].update(chunk_cap=2048), r"\$\.load\.full\.chunk_cap: 2048 is outside 64\.\.1024"),
        (lambda d: d["load"]["full"].update(bound_ms=1e9), r"\$\.load\.full\.bound_ms: .* is outside"),
        (lambda d: d["load"].update(worst_loss=-0.5), r"\$\.load\.worst_loss: -0\.5 is outside"),
    ],
)
def test_a_broken_load_is_named(mutate, message):
    data = with_rule()
    mutate(data)
    with pytest.raises(ValueError, match=message):
        from_dict(data)


def test_validate_says_what_the_rule_holds():
    chosen = RULE | {"worst_loss": 0.012, "worst_at": "8192-token prompts at concurrency-6", "idle_worst_loss": 0.2}
    line = validate(from_dict(with_rule(chosen)))
    assert "; under load, once the work fills 2 x 4 slots, chunks of one latency up to 12 ms and 1024 tokens" in line
    assert "(chosen for its worst loss 1.2%, at 8192-token prompts at concurrency-6; the idle rules' 20.0%)" in line
    assert "; no under-load rule (the same chunks at every load);" in validate(load(TINY))
    old = validate(from_dict(with_rule(SCHEMA_4_RULE, 4)))
    assert "its schema 4 under-load rule (a count of pending requests) is not read" in old and "refit" in old
    assert math.isinf(LoadRule.from_dict(RULE | {"full": {"bound_ms": None, "chunk_cap": 64}}).bound_ms)
