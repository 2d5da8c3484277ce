"""ppprof.compare.policies (with its verdict and text) on policies built from coefficients: the exact table comparison
(against a naive walk over every prefix length), TTFT rows and the verdict."""

import dataclasses

from ppprof.compare.policies import compare_policies, compare_tables
from ppprof.compare.render import render
from ppprof.compare.verdict import DEFAULT_TOLERANCES
from ppprof.policy import from_dict
from ppprof.policy.rule import LatencyModel
from tests.policy.policy_helpers import policy_dict

MODEL = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=2e-4)
SMALL = {"base_chunk_size": 512, "page_size": 1, "context_len": 32768}


def policy(model=MODEL, **kw):
    data = policy_dict(model, **{**SMALL, **kw})
    data["report"]["domain"] = {"prefix_len": [0, 20000], "chunk_size": [8, 640], "prefix_lens": [0, 1000, 5000, 20000]}
    return from_dict(data)


def test_table_comparison_equals_a_walk_over_every_prefix_len():
    base, cand = policy(), policy(dataclasses.replace(MODEL, a=3e-7))
    tol = dict(DEFAULT_TOLERANCES, table=0.0, table_units=0.0)
    table = compare_tables(base, cand, tol)
    sizes = [(base.next_chunk_size(L), cand.next_chunk_size(L)) for L in range(20001)]
    assert table["num_prefix_lens"] == 20001 and table["prefix_len_range"] == [0, 20000]
    assert table["num_changed"] == table["num_beyond"] == sum(b != c for b, c in sizes) > 0
    worst = max(abs(c - b) for b, c in sizes)
    assert abs(table["worst"]["change_tokens"]) == worst
    for row in table["rows"]:
        lo, hi = row["prefix_len"]
        assert {sizes[L] for L in range(lo, hi + 1)} == {(row["baseline"], row["candidate"])}
    assert compare_tables(base, cand, dict(tol, table_units=worst / 64))["num_beyond"] == 0


def test_identical_policies_do_not_drift_and_status_change_does():
    base = policy()
    report = compare_policies(base, policy(), DEFAULT_TOLERANCES)
    assert not report["drifted"] and report["table"]["num_changed"] == 0
    assert all(r["change"] == 0 for r in report["ttft"]["rows"] + report["coefficients"])
    assert [r["prompt_len"] for r in report["ttft"]["rows"]] == [2048] * 6 + [8192] * 6 + [32768] * 6
    assert all(r["regret"] == 0 for r in report["ttft"]["rows"] if r["strategy"] in ("policy", "policy-history"))
    assert report["ttft"]["num_stages"] == 4  # the helper's provenance: four stages
    static = compare_policies(base, policy(status="static"), DEFAULT_TOLERANCES)
    assert static["drifted"] and [c["figure"] for c in static["checks"] if not c["passed"]][0] == "status"
    assert "DRIFT status: dynamic -> static" in render(static)
    assert render(report).endswith("within tolerance")


def test_compare_imports_no_heavy_module():
    from tests.policy.test_imports import loaded_after

    assert loaded_after("import ppprof.compare.policies") == []
