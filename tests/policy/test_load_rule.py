"""The under-load rule (policy.json's `load`, schema 4): Policy.next_chunk_size with the scheduler's load answers as
with none below the handover (and always without a rule: a schema 3 policy reads and answers as it did), the
under-load chunk at and past it; the file's `load` is checked (a schema 4 field, columns, bounds, the unit and the
profiled domain) and `validate` says what it holds."""

import copy
import json
import math
from pathlib import Path

import pytest

from ppprof.policy import from_dict, load, validate
from ppprof.policy.bounded import rule_table
from ppprof.policy.tables import LoadRule, table_chunk_size

TINY = Path(__file__).resolve().parents[1] / "runs/tiny-hybrid/policy.json"


def bounded(bound_ms: float, cap: int) -> tuple[list[int], list[int]]:
    """The bounded rule (bound, cap) on the committed tiny-hybrid policy's planning model, as a breakpoint table."""
    policy = load(TINY)
    return rule_table(policy.planning_model, bound_ms, cap, 64, policy.data["prompt_table"]["max_prompt_len"])


STARTS, SIZES = bounded(12.0, 1024)  # from 3 pending: chunks of at most 12 ms predicted, at most 1024 tokens
RULE = {
    "pending_requests": [1, 3],
    "bound_ms": [None, 12.0],
    "chunk_cap": [512, 1024],
    "prefix_len": [[0], STARTS],
    "chunk_size": [[512], SIZES],
    "handover_tokens": 0,
}


def tiny_data() -> dict:
    return json.loads(TINY.read_text())


def with_rule(rule: dict | None = None) -> dict:
    data = tiny_data()
    data["schema_version"] = 4
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


def test_a_schema_3_policy_reads_and_answers_at_every_load_as_with_none():
    policy = load(TINY)
    assert policy.data["schema_version"] == 3 and policy.load_rule is None
    for L, n in every_ask(policy):
        want = policy.next_chunk_size(L, n)
        assert policy.next_chunk_size(L, n, pending_requests=0, pending_tokens=0) == want
        assert policy.next_chunk_size(L, n, pending_requests=5, pending_tokens=9000) == want, f"{L=} {n=}"


def test_without_load_a_schema_4_policy_answers_chunk_for_chunk_as_before():
    today, loaded = load(TINY), from_dict(with_rule())
    assert loaded.load_rule == LoadRule([1, 3], [math.inf, 12.0], [512, 1024], [[0], STARTS], [[512], SIZES], 0)
    assert len(SIZES) > 2 and SIZES == sorted(SIZES, reverse=True)  # a rule that shrinks with the prefix
    for L, n in every_ask(today):
        want = today.next_chunk_size(L, n)
        assert loaded.next_chunk_size(L, n) == want, f"{L=} {n=}"
        assert loaded.next_chunk_size(L, n, pending_requests=0, pending_tokens=0) == want, f"{L=} {n=}"
    for n in (100, 700, 1025):
        assert loaded.plan(n) == today.plan(n) and loaded.plan_history(n) == today.plan_history(n)


@pytest.mark.parametrize(
    "pending_requests, pending_tokens, level", [(1, 1, 0), (2, 4000, 0), (3, 10, 1), (40, 10**6, 1)]
)
def test_past_the_handover_the_level_of_the_load_and_its_chunk_at_the_prefix(pending_requests, pending_tokens, level):
    policy = from_dict(with_rule())
    for prefix_len in (0, 300, 700, 1024, 3000):
        want = 512 if level == 0 else table_chunk_size(STARTS, SIZES, prefix_len)
        load = {"pending_requests": pending_requests, "pending_tokens": pending_tokens}
        assert policy.next_chunk_size(prefix_len, prefix_len + 1, **load) == want, f"{prefix_len=}"
        assert policy.next_chunk_size(prefix_len, **load) == want, f"{prefix_len=}"


def test_below_the_handover_tokens_the_idle_rules_answer():
    policy = from_dict(with_rule(RULE | {"handover_tokens": 2048, "pending_requests": [2, 3]}))
    idle = policy.next_chunk_size(300, 900)
    assert policy.next_chunk_size(300, 900, pending_requests=1, pending_tokens=5000) == idle  # one request: below
    assert policy.next_chunk_size(300, 900, pending_requests=2, pending_tokens=2047) == idle  # too few tokens
    assert policy.next_chunk_size(300, 900, pending_requests=2, pending_tokens=2048) == 512
    assert policy.next_chunk_size(300, 900, pending_requests=3, pending_tokens=2048) == table_chunk_size(
        STARTS, SIZES, 300
    )


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"pending_requests": -1}, ValueError, "a load is never negative"),
        ({"pending_tokens": -5}, ValueError, "a load is never negative"),
        ({"pending_requests": 1.5}, TypeError, "pending_requests must be an integer"),
        ({"pending_requests": True}, TypeError, "pending_requests must be an integer"),
    ],
)
def test_a_bad_load_is_refused_in_one_line(kwargs, error, message):
    with pytest.raises(error, match=message):
        from_dict(with_rule()).next_chunk_size(300, 900, **kwargs)


def test_numpy_counts_are_taken():
    np = pytest.importorskip("numpy")
    policy = from_dict(with_rule())
    want = table_chunk_size(STARTS, SIZES, 300)
    assert policy.next_chunk_size(300, 900, pending_requests=np.int64(3), pending_tokens=np.int32(7)) == want


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema_version=3), r"\$\.load: the under-load rule is a schema 4 field"),
        (lambda d: d["load"].update(chunk_cap=[512]), r"\$\.load\.chunk_cap: 1 entries for 2 levels"),
        (lambda d: d["load"].update(pending_requests=[3, 3]), r"pending_requests\[1\]: 3 after 3"),
        (lambda d: d["load"].update(pending_requests=[0, 3]), r"\$\.load\.pending_requests\[0\]: 0 is less than"),
        (lambda d: d["load"]["chunk_size"][0].__setitem__(0, 2**40), r"\$\.load\.chunk_size\[0\]\[0\]: .* is outside"),
        (lambda d: d["load"].pop("handover_tokens"), r"\$\.load\.handover_tokens: missing"),
        (lambda d: d["load"]["prefix_len"][1].__setitem__(1, 0), r"\$\.load\.level\[1\]\.prefix_len\[1\]: 0 after 0"),
        (lambda d: d["load"]["chunk_size"][1].__setitem__(1, 64), r"\$\.load\.level\[1\]: chunk 64 at prefix_len"),
        (lambda d: d["load"]["chunk_size"][0].__setitem__(0, 448), r"\$\.load\.level\[0\]: chunk 448 at prefix_len 0"),
        (lambda d: d["load"].update(chunk_cap=[512, 2048]), r"\$\.load\.chunk_cap\[1\]: 2048 is outside 64\.\.1024"),
        (
            lambda d: d["load"].update(
                levels=[{"concurrency": 2, "throughput_tokens_per_s": {"a": 1e13}, "ttft_mean_ms": {}}]
            ),
            r"throughput_tokens_per_s\.a: .* is outside",
        ),
    ],
)
def test_a_broken_load_is_named(mutate, message):
    data = with_rule()
    mutate(data)
    with pytest.raises(ValueError, match=message):
        from_dict(data)


def test_validate_says_what_the_rule_holds():
    line = validate(from_dict(with_rule()))
    assert f"; under load from 1 pending chunks 512-512, from 3 pending chunks {min(SIZES)}-{max(SIZES)};" in line
    assert "; no under-load rule (the same chunks at every load);" in validate(load(TINY))
