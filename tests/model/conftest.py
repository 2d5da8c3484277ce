"""Fixtures of the model tests."""

from __future__ import annotations

import pytest

from ppprof.specs.spec import ModelSpec

from .helpers import tiny_dense, tiny_hybrid


@pytest.fixture(params=["dense", "hybrid"])
def spec(request) -> ModelSpec:
    return tiny_dense() if request.param == "dense" else tiny_hybrid()
