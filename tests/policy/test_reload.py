"""The watch on a policy file (ppprof.policy.reload): it looks at most every interval, reads a changed file once and
votes its sha256 with the check's verdict; the ranks' votes give one decision on every rank (switch together, refuse
a file that fails a check on any rank and never take it, or keep the old policy while the ranks disagree, said
once)."""

from __future__ import annotations

import hashlib
import json

import pytest

from ppprof.policy.reload import CHECK_ENV, DEFAULT_CHECK_S, NO_VOTE, PolicyWatch, check_interval_s


def check(text: str):
    """A stand-in for the start-up checks: JSON with "ok": true."""
    data = json.loads(text)
    return (data, None) if data.get("ok") else (None, f"ok is {data.get('ok')!r}: write a good file")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def watched(tmp_path):
    path = tmp_path / "policy.json"
    first = json.dumps({"ok": True, "v": 1})
    path.write_text(first)
    clock = Clock()
    return path, PolicyWatch(str(path), sha(first), check, 5.0, clock), clock


def test_a_new_file_is_read_only_once_the_interval_has_passed(watched):
    path, watch, clock = watched
    new = json.dumps({"ok": True, "v": 2})
    path.write_text(new)
    clock.now = 4.9
    assert not watch.poll() and watch.vote() == NO_VOTE, "looked before the interval passed"
    clock.now = 5.0
    assert watch.poll() and watch.vote() == (sha(new), None)
    decision = watch.decide([watch.vote(), (sha(new), None)])
    assert decision.action == "switch" and decision.digest == sha(new)
    assert watch.take(decision) == {"ok": True, "v": 2} and watch.digest == sha(new) and watch.vote() == NO_VOTE


def test_the_same_file_written_again_is_no_vote(watched):
    path, watch, clock = watched
    path.write_text(path.read_text())  # a new mtime, the same bytes
    clock.now = 10
    watch.poll()
    assert watch.vote() == NO_VOTE and watch.decide([NO_VOTE, NO_VOTE]).action == "none"


def test_a_corrupted_file_is_refused_on_every_rank_and_never_taken(watched):
    path, watch, clock = watched
    bad = '{"ok": tr'  # cut mid-write
    path.write_text(bad)
    clock.now = 5
    watch.poll()
    digest, problem = watch.vote()
    assert digest == sha(bad) and problem.startswith("Expecting value"), problem
    decision = watch.decide([NO_VOTE, (digest, problem)])  # refused though this rank's own vote came second
    assert decision.action == "refuse" and decision.digest == sha(bad)
    assert decision.line.startswith(f"policy file {path} (sha256 {sha(bad)[:12]}) refused, the policy in use")
    assert "rank 1: Expecting value" in decision.line
    assert watch.digest != sha(bad) and watch.vote() == NO_VOTE
    path.write_text(bad + " ")
    path.write_text(bad)  # the same bad bytes again: never voted again
    clock.now = 10
    watch.poll(force=True)
    assert watch.vote() == NO_VOTE


def test_a_file_one_rank_refuses_is_refused_by_all(watched):
    path, watch, clock = watched
    good = json.dumps({"ok": True, "v": 3})
    path.write_text(good)
    watch.poll(force=True)
    other = (sha(good), "page_size: policy 64, server 1: ...")  # the same file fails another rank's server check
    decision = watch.decide([watch.vote(), other])
    assert decision.action == "refuse" and "rank 1: page_size" in decision.line
    assert sha(good) in watch.refused and watch.vote() == NO_VOTE


def test_ranks_that_disagree_keep_the_old_policy_and_say_it_once(watched):
    path, watch, clock = watched
    new = json.dumps({"ok": True, "v": 4})
    path.write_text(new)
    watch.poll(force=True)
    first = watch.decide([watch.vote(), NO_VOTE])
    assert first.action == "wait" and "rank 1 not read yet" in first.line and "kept until every rank" in first.line
    assert watch.decide([watch.vote(), NO_VOTE]).line is None, "the same disagreement said twice"
    other = watch.decide([watch.vote(), (sha("another file"), None)])
    assert other.action == "wait" and sha("another file")[:12] in other.line
    assert watch.decide([watch.vote(), watch.vote()]).action == "switch"


def test_the_interval_comes_from_the_environment():
    assert check_interval_s({}) == (DEFAULT_CHECK_S, None)
    assert check_interval_s({CHECK_ENV: "0.5"}) == (0.5, None)
    value, line = check_interval_s({CHECK_ENV: "-1"})
    assert value == DEFAULT_CHECK_S and line.startswith(f"{CHECK_ENV}='-1' is not a number of seconds")


def test_a_switch_takes_the_file_voted_for_though_a_look_since_found_another(watched):
    path, watch, clock = watched
    voted = json.dumps({"ok": True, "v": 5})
    path.write_text(voted)
    watch.poll(force=True)
    votes = [watch.vote(), (sha(voted), None)]
    path.write_text(json.dumps({"ok": True, "v": 6}))  # the watch's thread looks while the ranks gather
    watch.poll(force=True)
    decision = watch.decide(votes)
    assert watch.take(decision) == {"ok": True, "v": 5} and watch.digest == sha(voted)
    assert watch.vote()[0] == sha(json.dumps({"ok": True, "v": 6})), "the newer file is the next vote"
