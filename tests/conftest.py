import os

import pytest
import torch
import torch.distributed as dist

from tests.multirank import free_port

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One intra-op thread a worker: torch's default is every core, and with a worker a core the two workers' OpenMP
    # threads spin against each other (tests/model, tests/probe and tests/mem took 80-133 s wall and 108-132 s of CPU
    # on 2 workers, 12-19 s and 17-18 s so). The ranks the tests start set their own threads (ppprof.run.rank).
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_rank_group():
    """A real one-rank gloo process group in this process, for the in-process tests of code that talks to ranks."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
