"""`ppprof compare`'s --tolerance items, parsed in the command layer."""

import math

import pytest

from ppprof.commands.compare import parse_tolerances
from ppprof.compare.verdict import DEFAULT_TOLERANCES


def test_parse_tolerances():
    assert parse_tolerances(()) == DEFAULT_TOLERANCES
    tol = parse_tolerances(["ttft=10%, table=0.05", "coef=none"])
    assert tol["ttft"] == pytest.approx(0.1) and tol["table"] == 0.05 and math.isinf(tol["coef"])
    old = parse_tolerances(["level=1.5, samples=0.3"])  # level: the old name of pace, read for older scripts
    assert old == parse_tolerances(["pace=1.5,samples=0.3"]) and old["pace"] == 1.5 and "level" not in old
    assert parse_tolerances(["pace=0.5", "level=none"])["pace"] == math.inf  # the later item wins, either name
    for bad in ("ttft", "speed=1", "ttft=x", "ttft=-0.1"):
        with pytest.raises(ValueError, match="--tolerance"):
            parse_tolerances([bad])
