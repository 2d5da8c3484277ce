"""The drift check (`ppprof compare POLICY TRACE`, ppprof.compare.forwards) on forward traces written by the real
writer, whose forwards follow a known latency model (tests/fit/test_live.py's), and on live forwards built in place."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.compare.forwards import judge
from ppprof.fit.live import calibrate
from ppprof.fit.live_forwards import LiveForwards, predicted_ms
from ppprof.policy.runtime import upgraded
from tests.fit.test_live import POLICY, known_forwards
from tests.forwards.helpers import write_trace


def keys(report) -> set[str]:
    """Every key of a JSON report, at any depth."""
    if isinstance(report, dict):
        return set(report).union(*(keys(v) for v in report.values()))
    if isinstance(report, list):
        return set().union(*(keys(v) for v in report))
    return set()


def test_compare_passes_a_trace_of_the_policys_costs_and_names_where_one_drifted(tmp_path):
    prefixes, chunks = [0, 128, 256, 512, 1024, 2048], [32, 64, 128, 256, 512, 1024]
    same, moved = tmp_path / "same.jsonl", tmp_path / "moved.jsonl"
    write_trace(same, known_forwards(prefixes, chunks), 10**5)
    calibrate(POLICY, [same], tmp_path / "p.json", "prefix")
    write_trace(same.with_name("again.jsonl"), known_forwards(prefixes, chunks, seed=1), 10**5)
    slower = known_forwards(prefixes, chunks, seed=2, scale=lambda stage, L: 1.6 if stage == 0 and L >= 1024 else 1)
    write_trace(moved, slower, 10**5)
    ok = CliRunner().invoke(main, ["compare", str(tmp_path / "p.json"), str(same.with_name("again.jsonl"))])
    assert ok.exit_code == 0 and "within tolerance" in ok.output, ok.output
    bad = CliRunner().invoke(main, ["compare", str(tmp_path / "p.json"), str(moved), "--json"])
    assert bad.exit_code == 1, bad.output
    report = json.loads(bad.output)
    assert keys(report) >= {"pace", "pace_interval", "vs_pace", "vs_pace_interval"}, keys(report)
    assert not {k for k in keys(report) if "level" in k}, keys(report)  # the old names, retired (issue 47)
    assert report["tolerances"] == {"pace": 0.2, "samples": 0.2}
    assert report["drifted"] and any(w.startswith("stage 0 prefix 1024-") for w in report["where"]), report["where"]
    assert not any(w.startswith("stage 1") for w in report["where"]), report["where"]


def test_a_band_drifts_only_where_its_noise_cannot_explain_the_move():
    """A band of a few scattered forwards whose median sits 25% above the pace is noise (its 80% interval reaches
    inside the tolerance); a band of many steady forwards 30% above is drift; the pace is judged the same way."""
    policy = upgraded(json.loads(POLICY.read_text()))  # a committed policy of schema 3, as a load reads it
    rng = np.random.default_rng(0)
    pieces = [((0, 256),)] * 60 + [((512, 256),)] * 8 + [((1024, 256),)] * 40
    live = LiveForwards(np.zeros(len(pieces), dtype=np.int64), pieces, np.ones(len(pieces)), np.arange(len(pieces)))
    factor = np.concatenate(
        [
            np.exp(rng.normal(0, 0.02, 60)),
            1.25 * np.array([0.55, 0.7, 0.8, 1.0, 1.0, 1.3, 1.5, 1.8]),  # median 1.25, scattered
            1.3 * np.exp(rng.normal(0, 0.02, 40)),
        ]
    )
    live.latency_ms = 1.5 * predicted_ms(policy, live) * factor  # a server 1.5x the policy's pace
    report = judge(policy, live, {"pace": 0.2, "samples": 0.2})
    bands = {r["band"]: r for r in report["bands"]}
    assert not bands["0"]["drifted"] and not bands["512-1023"]["drifted"], bands["512-1023"]
    assert bands["512-1023"]["vs_pace"] > 0.2, "the scattered band's median is beyond the tolerance"
    assert bands[">=1024"]["drifted"], bands
    assert report["where"][0].startswith("every stage: live forwards at 1.") and len(report["where"]) == 2
