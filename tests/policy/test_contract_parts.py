"""ppprof.policy.contract: the parts a server reads, each checked and bounded in its own __post_init__ (the bounds
ppprof.policy.numbers held for them, with the same one-line refusal), and its one-prefix bounded rule the same as the
bulk one the fit builds tables with (tests/test_layering.py checks what the contract imports)."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from ppprof.policy.bounded import bounded_sizes
from ppprof.policy.contract import CONTRACT_FIELDS, HistoryTable, LoadRule, PromptRule, bounded_chunk
from ppprof.policy.numbers import number_error, values_at
from ppprof.policy.rule import LatencyModel
from ppprof.policy.runtime import from_dict, load

from .policy_helpers import policy_dict
from .test_numbers import steps

REPO = Path(__file__).resolve().parents[2]
MODEL = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=2e-4)


def full_policy() -> dict:
    """A policy holding every number CONTRACT_FIELDS names: an under-load rule with a floor, the table's bound."""
    data = policy_dict(MODEL) | {"load": LoadRule(4, 2.0, 64, 12.0, 1024, 256).to_dict()}
    data["overhead"]["stderr_ms"] = 0.1
    return data


@pytest.mark.parametrize("path, bound", CONTRACT_FIELDS, ids=[p for p, _ in CONTRACT_FIELDS])
def test_each_part_refuses_a_number_past_its_bound_as_numbers_did(path, bound):
    data = full_policy()
    found = list(values_at(data, steps(path)))
    if path == "table.bound_ms" and not found:
        pytest.skip("the history-only table of this policy has no bound (fixed chunks)")
    assert found, f"{path} is not in the test's policy"
    where = found[-1][0]
    node, keys = data, [k for k in where.removeprefix("$").replace("]", "").replace("[", ".").split(".") if k]
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    last = keys[-1]
    beyond = bound.high + 1
    if isinstance(node, list):
        node[int(last)] = beyond
    else:
        node[last] = beyond
    message = number_error(data)
    assert message is not None and message.startswith(where)
    with pytest.raises(ValueError) as e:
        from_dict(copy.deepcopy(data))
    assert str(e.value).startswith(message), f"{e.value}"


def test_tables_refuse_columns_out_of_order_when_built_in_python():
    with pytest.raises(ValueError, match=r"\$\.table\.prefix_len\[2\]: 64 after 128: prefix_len must increase"):
        HistoryTable([0, 128, 64], [512, 256, 128])
    with pytest.raises(ValueError, match=r"\$\.prompt_table\.merge_len: 0 entries for 1 bands"):
        PromptRule([1], [1.0], [], [[0]], [[64]], 64)
    with pytest.raises(ValueError, match=r"\$\.load\.fill: 2000\.0 is outside 0\.\.1000"):
        LoadRule(2, 2000.0, 64, 10.0, 1024)


def committed_models() -> list:
    """(planning model, unit, prompt-aware rule) of every committed policy with a model (test_schema's "ok" ones)."""
    verdicts = json.loads((Path(__file__).with_name("data") / "verdicts-before-contract.json").read_text())
    policies = [load(REPO / f) for f, verdict in sorted(verdicts.items()) if verdict == "ok"]
    return [(p.planning_model, p.data["prompt_table"]["unit"], p.prompt_rule) for p in policies if p.planning_model]


def test_the_one_prefix_bounded_rule_is_the_bulk_one_on_every_committed_model():
    """rebuilt's check and the sizer's under-load answer use bounded_chunk; the fit's tables come from bounded_sizes."""
    rng = np.random.default_rng(0)
    models = committed_models()
    assert len(models) >= 50
    for model, unit, rule in models:
        prefixes = rng.integers(0, 2 * max(rule.prompt_len[-1], 4096), 40)
        bounds = np.array([b for b in rule.bound_ms if np.isfinite(b)][:5] + [np.inf, 1.0, 1e4])
        for bound in bounds:
            caps = np.full(len(prefixes), rule.largest_chunk)
            bulk = bounded_sizes(model, np.full(len(prefixes), bound), caps, prefixes, unit)
            one = [bounded_chunk(model, float(bound), rule.largest_chunk, int(L), unit) for L in prefixes]
            assert one == bulk.tolist(), f"{model=} {bound=}"
