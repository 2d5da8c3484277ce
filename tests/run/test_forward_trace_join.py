"""Joining the ranks' parts of a forward trace: a part a writer left mid-line (it turned itself off) gives up that
half record, so the joined trace still reads; whole parts join as they are."""

from ppprof.forwards import read_forwards
from ppprof.run.forward_trace import whole_lines
from tests.forwards.helpers import write_trace

FORWARDS = [(0, 0, [(0, 256)], 4.5, 1000.0), (0, 0, [(256, 256)], 5.0, 1000.1)]


def test_a_part_cut_mid_line_gives_up_its_half_record(tmp_path):
    part = tmp_path / "t.jsonl.rank0"
    write_trace(part, FORWARDS)
    whole = part.read_bytes()
    assert whole_lines(part) == len(whole)
    part.write_bytes(whole + b'{"kind": "forw')
    assert whole_lines(part) == len(whole)
    joined = tmp_path / "t.jsonl"
    with open(part, "rb") as f:
        joined.write_bytes(f.read(whole_lines(part)) * 2)  # two parts of one server, one after the other
    assert len(read_forwards([joined])) == 4
