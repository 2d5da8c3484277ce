"""The (pp, tp) mesh's arithmetic: the TP ranks of a stage adjacent, each talking to its own TP rank on the
neighbouring stages."""

from ppprof.distributed.mesh import MeshCoords


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
