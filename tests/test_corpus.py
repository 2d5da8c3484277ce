"""The bad-input corpus (issue 11): every bad input in tests/corpus/ is answered through the CLI, before any rank starts,
with exit code 2, one stderr line naming the setting, no traceback, and no new or changed file; the policy reader
answers bad history lengths with a TypeError or ValueError that says what it takes."""

from __future__ import annotations

import math
import shlex
import socket
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.policy import load
from ppprof.run.memory_check import host_available_bytes

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "corpus"
MEMORY_CASES = ("--max-mamba-cache-size 2000000000",)
"""Cases refused by the memory check, which needs /proc/meminfo (Linux)."""


def read_cases() -> list[tuple[str, str]]:
    cases = []
    for line in (CORPUS / "cases.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            setting, _, args = line.partition(" | ")
            cases.append((setting.strip(), args.strip()))
    return cases


CASES = read_cases()


def snapshot(*folders: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folders`: (size, mtime in ns)."""
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns) for folder in folders for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def busy_port():
    """A port held open (listening) for the duration of the tests: `--master-port` at it must be refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_the_corpus_holds_at_least_60_bad_inputs_of_every_family():
    assert len(CASES) >= 60, f"{len(CASES)=}"
    commands = {args.split()[0] for _, args in CASES}
    assert {"profile", "bench", "fit", "plan", "export", "validate"} <= commands, f"{commands=}"
    for family in ("yaml", "specs", "hf", "csv", "policies", "traces", "mooncake"):
        files = list((CORPUS / family).iterdir())
        used = [f for f in files if any(f"{{corpus}}/{family}/{f.name}" in args for _, args in CASES)]
        assert len(used) >= 6 and len(used) >= len(files) - 1, f"{family=} {len(files)=} {len(used)=}"


HUGE_TRACE_ROWS = 10**6
HUGE_MOONCAKE_LINES = 200_001
"""A Mooncake trace one request past ppprof.traces.mooncake.MAX_REQUESTS: a trace of 10^8 lines is refused at the
same line, the reader never going further."""


@pytest.fixture(scope="module")
def huge_trace(tmp_path_factory):
    """A trace of HUGE_TRACE_ROWS good rows under a header, then a row of length 0: line HUGE_TRACE_ROWS + 2."""
    path = tmp_path_factory.mktemp("trace") / "trace.csv"
    lens = np.random.default_rng(0).integers(100, 8000, HUGE_TRACE_ROWS)
    path.write_text("input_len\n" + "\n".join(map(str, lens.tolist())) + "\n0\n")
    return path


@pytest.fixture(scope="module")
def huge_mooncake(tmp_path_factory):
    path = tmp_path_factory.mktemp("mooncake") / "huge.jsonl"
    line = '{"timestamp": %d, "input_length": 600, "output_length": 1, "hash_ids": [%d, 2]}\n'
    path.write_text("".join(line % (t, t) for t in range(HUGE_MOONCAKE_LINES)))
    return path


@pytest.fixture(scope="module")
def huge_forward_trace(tmp_path_factory):
    """A forward trace of 10^8 records' size (about 100 bytes each): a sparse file, refused by its size unread."""
    path = tmp_path_factory.mktemp("forwards") / "huge.jsonl"
    with path.open("wb") as f:
        f.truncate(10**8 * 100)
    return path


@pytest.mark.parametrize("setting,args", CASES, ids=[args for _, args in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, busy_port, setting, args, request):
    if any(args.endswith(m) for m in MEMORY_CASES) and host_available_bytes() is None:
        pytest.skip("no /proc/meminfo here: the memory check cannot tell")
    trace = request.getfixturevalue("huge_trace") if "{huge_trace}" in args else None
    forwards = request.getfixturevalue("huge_forward_trace") if "{huge_forward_trace}" in args else None
    mooncake = request.getfixturevalue("huge_mooncake") if "{huge_mooncake}" in args else None
    argv = shlex.split(
        args.format(
            corpus=CORPUS,
            repo=REPO,
            tmp=tmp_path,
            busy_port=busy_port,
            huge_trace=trace,
            huge_forward_trace=forwards,
            huge_mooncake=mooncake,
        )
    )
    monkeypatch.chdir(tmp_path)
    watched = (tmp_path, CORPUS, REPO / "results")
    before = snapshot(*watched)
    result = CliRunner().invoke(main, argv)
    assert isinstance(result.exception, SystemExit), f"{argv=} raised {result.exception!r}"
    assert result.exit_code == 2, f"{argv=} {result.exit_code=} {result.output=}"
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{argv=} {result.stderr=}"
    assert setting in lines[0], f"{setting=} not in {lines[0]!r}"
    assert len(lines[0]) < 600, f"{lines[0]=}"
    assert snapshot(*watched) == before, f"{argv=} wrote or changed a file"


@pytest.fixture(scope="module")
def policy():
    return load(CORPUS / "policies" / "valid.json")


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda p: p.next_chunk_size(512.0), TypeError, "prefix_len must be an integer .* got float 512.0"),
        (lambda p: p.next_chunk_size(1.5), TypeError, "got float 1.5"),
        (lambda p: p.next_chunk_size(math.nan), TypeError, "got float nan"),
        (lambda p: p.next_chunk_size(math.inf), TypeError, "got float inf"),
        (lambda p: p.next_chunk_size(True), TypeError, "got bool True"),
        (lambda p: p.next_chunk_size("512"), TypeError, "got str '512'"),
        (lambda p: p.next_chunk_size(np.float64(512)), TypeError, "got float64"),
        (lambda p: p.next_chunk_size(np.bool_(True)), TypeError, "got bool"),
        (lambda p: p.next_chunk_size([512]), TypeError, "got list"),
        (lambda p: p.next_chunk_size(), TypeError, "missing the prefix_len argument"),
        (lambda p: p.next_chunk_size(history_len=2.0), TypeError, "got float 2.0"),
        (lambda p: p.next_chunk_size(1, history_len=1), TypeError, "not both"),
        (lambda p: p.next_chunk_size(-1), ValueError, "prefix_len -1 is negative"),
        (lambda p: p.next_chunk_size(np.int64(-7)), ValueError, "prefix_len -7 is negative"),
        (lambda p: p.plan(4096.0), TypeError, "prompt_len must be an integer"),
        (lambda p: p.plan(0), ValueError, "--prompt-len 0 is invalid"),
        (lambda p: p.plan(10**12), ValueError, "--prompt-len 1000000000000 exceeds the policy's context_len 8192"),
    ],
)
def test_the_reader_refuses_what_is_not_a_token_count(policy, call, error, message):
    with pytest.raises(error, match=message):
        call(policy)


def test_the_reader_takes_python_and_numpy_ints_alike(policy):
    for L in (0, 1, 600, 5000, 8191, 10**6):
        expected = policy.next_chunk_size(L)
        for value in (np.int64(L), np.int32(min(L, 2**31 - 1)), np.uint64(L)):
            assert policy.next_chunk_size(value) == expected, f"{value=!r}"
            assert type(policy.next_chunk_size(value)) is int
        assert policy.next_chunk_size(history_len=np.int16(min(L, 2**15 - 1))) == policy.next_chunk_size(
            min(L, 2**15 - 1)
        )
    assert policy.plan(np.int64(4096)) == policy.plan(4096)
