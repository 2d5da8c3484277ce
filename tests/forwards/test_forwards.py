"""The forward trace: the writer's records against the schema and docs/forwards.md, its cap, its queue that never
blocks, its turning off; the bounded reader and every bad input it refuses with the file and the line."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from pathlib import Path

import jsonschema
import pytest

import ppprof.forwards as forwards_pkg
from ppprof.forwards import ForwardTraceWriter, read_forwards
from ppprof.forwards import reader as reader_module
from ppprof.forwards import writer as writer_module
from tests.forwards.helpers import trace_header, write_trace

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((Path(forwards_pkg.__file__).parent / "forwards.schema.json").read_text())
FORWARDS = [
    (0, 0, [(0, 256)], 4.5, 1000.0),
    (1, 0, [(0, 256)], 4.1, 1000.01),
    (0, 0, [(256, 256), (0, 128)], 7.25, 1000.02),
    (1, 0, [(256, 256), (0, 128)], 6.5, 1000.03),
]


def test_every_record_the_writer_writes_matches_the_schema_and_the_docs(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, FORWARDS)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["kind"] for r in records] == ["header"] + ["forward"] * 4 + ["end"], f"{records=}"
    for record in records:
        jsonschema.validate(record, SCHEMA)
    assert records[2]["pieces"] == [[0, 256]] and records[3]["pieces"] == [[256, 256], [0, 128]]
    assert records[-1] == {"kind": "end", "records": 4, "dropped": 0}
    doc = (REPO / "docs" / "forwards.md").read_text()
    fields = {k for variant in SCHEMA["oneOf"] for k in variant["properties"]}
    missing = sorted(f for f in fields if f"`{f}`" not in doc)
    assert not missing, f"docs/forwards.md does not name {missing=}"


def test_the_schema_refuses_what_the_reader_refuses():
    bad = {"kind": "forward", "stage": 0, "tp_rank": 0, "pieces": [[0, 0]], "latency_ms": -1.0, "time_s": 1.0}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_the_reader_reads_back_what_was_written(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, FORWARDS)
    got = read_forwards([path])
    assert got.stage == [0, 1, 0, 1] and got.latency_ms == [4.5, 4.1, 7.25, 6.5]
    assert got.pieces[2] == ((256, 256), (0, 128))
    assert got.time_span_s == (1000.0, 1000.03)
    assert got.files[0]["forwards"] == 4 and len(got.files[0]["sha256"]) == 64


def test_the_cap_drops_and_counts(tmp_path):
    path = tmp_path / "t.jsonl"
    writer = write_trace(path, FORWARDS * 3, max_records=5)
    assert (writer.written, writer.dropped) == (5, 7), f"{writer.written=} {writer.dropped=}"
    got = read_forwards([path])
    assert len(got) == 5 and got.dropped_by_writer == 7


def test_a_full_queue_drops_and_never_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "QUEUE_SIZE", 4)
    gate, released = threading.Event(), []
    writer = ForwardTraceWriter(tmp_path / "t.jsonl", trace_header(), 100)

    def held() -> float:  # the first forward's time is read only once the test lets it: the thread waits
        released.append(gate.wait(30))  # False: the gate was never set, the loop below was stuck in record()
        return 3.0

    writer.record(0, 0, [(0, 64)], held, 1.0)
    time.sleep(0.05)  # the thread has taken it and waits in held()
    for _ in range(20):
        writer.record(0, 0, [(0, 64)], 2.0, 1.0)
    gate.set()  # reached only if no record() above waited for the stalled thread
    writer.close()
    assert released == [True], "record() waited for the writer's thread"
    assert writer.dropped == 16 and writer.written == 5, f"{writer.dropped=} {writer.written=}"


def test_a_trace_that_cannot_be_written_turns_itself_off_with_one_line(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="ppprof"):
        writer = ForwardTraceWriter(tmp_path / "no" / "such" / "folder" / "t.jsonl", trace_header(), 10)
        writer.record(0, 0, [(0, 64)], 1.0, 1.0)
        writer.close()
    assert writer.off and writer.written == 0
    assert len(caplog.records) == 1 and "tracing is off, serving goes on" in caplog.records[0].getMessage()


def test_an_existing_file_is_never_overwritten(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("keep\n")
    writer = ForwardTraceWriter(path, trace_header(), 10)
    writer.close()
    assert writer.off and path.read_text() == "keep\n"


def lines(*records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


GOOD = {"kind": "forward", "stage": 0, "tp_rank": 0, "pieces": [[0, 64]], "latency_ms": 1.0, "time_s": 1.0}


@pytest.mark.parametrize(
    "text,message",
    [
        ("", r"t.jsonl is empty"),
        (lines(trace_header()), r"holds no forwards"),
        (lines(trace_header(), GOOD) + '{"kind": "forw', r"line 3 ends mid-record .*delete that last line"),
        (lines(GOOD), r"line 1 is not the header"),
        (lines(trace_header(), GOOD | {"latency_ms": float("nan")}), r"line 2: latency_ms nan is not a finite"),
        (lines(trace_header(), GOOD | {"latency_ms": -2.0}), r"line 2: latency_ms -2.0"),
        (lines(trace_header(), GOOD | {"pieces": [[4000, 256]]}), r"line 2: piece \[4000, 256\] .*context_len 4096"),
        (lines(trace_header(), GOOD | {"stage": 2}), r"line 2: stage 2 is not an integer in 0..1"),
        (
            lines(trace_header(), GOOD, trace_header(server="sglang", server_version="0.5.23"), GOOD),
            r"line 3 starts the trace of another server .*server 'ppprof serve-bench' != 'sglang'",
        ),
        (lines(trace_header() | {"version": 2}, GOOD), r"line 1: format .* version 2"),
        ("not json\n", r"line 1 is not a JSON record"),
    ],
)
def test_bad_traces_are_one_line_naming_file_and_line(tmp_path, text, message):
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as e:
        read_forwards([path])
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_traces_of_two_servers_are_not_read_as_one(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_trace(a, FORWARDS)
    write_trace(b, FORWARDS, pp_size=4)
    with pytest.raises(ValueError, match=r"b.jsonl line 1 is the trace of another server .*pp_size 2 != 4"):
        read_forwards([a, b])


def test_a_huge_trace_is_refused_by_its_size_before_it_is_read(tmp_path):
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as f:  # 10^8 records of ~100 bytes: a sparse file, nothing is written
        f.truncate(10**8 * 100)
    with pytest.raises(ValueError, match=re.escape(f"forward trace {path} holds 9.31 GiB")):
        read_forwards([path])


def test_the_record_cap_is_counted_over_all_traces(tmp_path, monkeypatch):
    monkeypatch.setattr(reader_module, "MAX_RECORDS", 6)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_trace(a, FORWARDS)
    write_trace(b, FORWARDS)
    with pytest.raises(ValueError, match=r"b.jsonl line 4 is past the 6 forwards read in all"):
        read_forwards([a, b])
