"""Agreement between ranks, on a one-rank gloo group: a failure inside a phase becomes one RunError naming the rank."""

import pytest
import torch

from ppprof.distributed.agree import RunError, agreed, stop_if_any_failed
from ppprof.distributed.pipe import Pipe


def pipe():
    return Pipe(rank=0, pp_size=1, device=torch.device("cpu"), hidden_size=8, dtype=torch.float32)


def test_an_exception_in_the_body_becomes_one_agreed_error_naming_rank_and_phase(one_rank_group):
    with pytest.raises(RunError, match=r"^rank 0: build the stage: MemoryError: no room$"):
        with agreed(pipe(), "build the stage"):
            raise MemoryError("no room")


def test_a_body_that_succeeds_goes_on_and_an_agreed_error_passes_through(one_rank_group):
    done = []
    with agreed(pipe(), "warm up"):
        done.append(1)
    assert done == [1]
    with pytest.raises(RunError, match=r"^already agreed$"):
        with agreed(pipe(), "outer"):
            raise RunError("already agreed")


def test_stop_if_any_failed_is_silent_without_an_error(one_rank_group):
    stop_if_any_failed(pipe(), None)
    with pytest.raises(RunError, match="rank 0: it broke"):
        stop_if_any_failed(pipe(), "it broke")
