"""A stage boundary at PP2 x TP2 on 4 real gloo ranks, as servers send it: each TP rank sends its 1/tp slice of the
(replicated) hidden state and residual, the next stage's TP ranks all-gather them; blocking and posted receives, a
chunk whose values TP does not divide crossing whole, and a failed status crossing as its header alone."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ppprof.distributed.mesh import build_mesh
from ppprof.distributed.pipe import FAILED, OK, Pipe
from tests.multirank import free_port

HIDDEN = 5
SIZES = (4, 3)
"""4 x 5 values split in two halves; 3 x 5 do not: whole."""


def activation(chunk_size: int, seed: int) -> torch.Tensor:
    """What every TP rank of the sending stage holds after its all-reduce: the same tensor."""
    return torch.randn(chunk_size, HIDDEN, generator=torch.Generator().manual_seed(seed))


def worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=4)
    try:
        mesh = build_mesh("cpu", 4, rank, 2)
        stage = mesh.coords.stage
        pipe = Pipe(
            rank=stage, pp_size=2, device=torch.device("cpu"), hidden_size=HIDDEN, dtype=torch.float32, mesh=mesh
        )
        assert pipe.sliced(4) and not pipe.sliced(3)
        for n in SIZES:
            hidden, residual = activation(n, n), activation(n, 10 + n)
            if stage == 0:
                sent = pipe.outgoing(hidden)
                assert sent.numel() == (n * HIDDEN // 2 if n == 4 else n * HIDDEN), (n, sent.shape)
                pipe.send_activation(OK, hidden, residual)
                pipe.wait_sends(pipe.isend_activation(OK, hidden * 2, residual * 2, n))
                pipe.wait_sends(pipe.isend_activation(FAILED, None, None, n))
                pipe.send_activation(FAILED, None, None)
            else:
                status, h, r = pipe.recv_activation()
                assert status == OK and torch.equal(h, hidden) and torch.equal(r, residual), (n, h, hidden)
                status, h, r = pipe.irecv_activation(n).wait()
                assert status == OK and torch.equal(h, hidden * 2) and torch.equal(r, residual * 2), n
                assert pipe.irecv_activation(n).wait() == (FAILED, None, None)
                assert pipe.recv_activation() == (FAILED, None, None)
    finally:
        dist.destroy_process_group()


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_tp_ranks_send_a_slice_each_and_the_next_stage_all_gathers():
    mp.start_processes(worker, args=(free_port(),), nprocs=4, start_method="spawn", join=True)
