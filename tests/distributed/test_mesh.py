"""The (pp, tp) mesh's arithmetic: the TP ranks of a stage adjacent, each talking to its own TP rank on the
neighbouring stages, and a job whose ranks form no such mesh refused."""

import pytest

from ppprof.distributed.coords import MeshCoords, mesh_problem


def test_pp2_tp2_puts_the_tp_ranks_of_a_stage_side_by_side():
    coords = [MeshCoords(2, 2, r) for r in range(4)]
    assert [(c.stage, c.tp_rank) for c in coords] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [c.global_rank(c.stage + 1) for c in coords[:2]] == [2, 3]  # TP rank t sends to TP rank t
    assert [c.global_rank(0) for c in coords[2:]] == [0, 1]  # the last stage's "done" goes back alike
    assert MeshCoords(4, 8, 27).stage == 3 and MeshCoords(4, 8, 27).global_rank(0, 0) == 0


def test_without_tp_a_rank_is_its_stage():
    assert [(MeshCoords(3, 1, r).stage, MeshCoords(3, 1, r).global_rank(r)) for r in range(3)] == [
        (0, 0),
        (1, 1),
        (2, 2),
    ]


@pytest.mark.parametrize(
    "world,tp,pp,local,message",
    [
        (4, 2, 2, 4, None),
        (4, 2, None, 2, None),
        (6, 4, None, 6, "--tp-size 4 does not divide the 6 ranks of the job"),
        (4, 2, 3, 4, "--pp-size 3 x --tp-size 2 = 6 ranks but the job has 4"),
        (4, 2, 2, 1, "--tp-size 2 would span nodes: a node's 1 ranks must hold whole TP groups"),
        (8, 4, 2, 2, "--tp-size 4 would span nodes"),
    ],
)
def test_the_mesh_is_refused_where_it_does_not_fit_the_job(world, tp, pp, local, message):
    problem = mesh_problem(world, tp, pp, local)
    assert (problem is None) if message is None else (message in problem), f"{problem=}"
