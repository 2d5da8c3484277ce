import pytest
import torch.distributed as dist

from tests.multirank import free_port


@pytest.fixture(scope="module")
def one_rank_group():
    """A real one-rank gloo process group in this process, for the in-process tests of code that talks to ranks."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
