"""The workload SPEC of `ppprof tune --prompt-lens`: lists, weights, files and traces, and one-line errors."""

import numpy as np
import pytest

from ppprof.config.workload import MAX_LENGTHS, parse_prompt_spec


def test_spec_lists_weights_and_files(tmp_path):
    w = parse_prompt_spec("8192,32768,8192")
    assert w.prompt_lens == (8192, 32768) and w.weights == pytest.approx((2 / 3, 1 / 3))
    assert parse_prompt_spec("1000:3, 2000:1").weights == pytest.approx((0.75, 0.25))
    lines = tmp_path / "lens.txt"
    lines.write_text("# prompt lengths\n4096\n\n8192,3\n")
    assert parse_prompt_spec(str(lines)).weights == pytest.approx((0.25, 0.75))
    trace = tmp_path / "trace.csv"
    rng = np.random.default_rng(0)
    trace.write_text(
        "request_id,input_len,output_len\n"
        + "".join(f"r{i},{n},10\n" for i, n in enumerate(rng.integers(100, 60000, 500)))
    )
    w = parse_prompt_spec(str(trace), 65536)
    assert len(w.prompt_lens) <= MAX_LENGTHS and "grouped into" in w.note and sum(w.weights) == pytest.approx(1)
    weighted = tmp_path / "w.csv"
    weighted.write_text("prompt_len,weight\n1000,1\n2000,4\n")
    assert parse_prompt_spec(str(weighted)).weights == pytest.approx((0.2, 0.8))


@pytest.mark.parametrize(
    "spec,message",
    [
        ("", "--prompt-lens is empty"),
        ("8192;32768", "is neither a list of token counts"),
        ("8192.5", "is neither a list"),
        ("0", "must be at least 1 token"),
        ("100000", "beyond the policy's context length 65536"),
        ("1000:-1", "weight -1 must be a positive finite number"),
        ("1000:nan", "weight nan must be a positive finite number"),
        ("10^12", "is neither a list"),
    ],
)
def test_bad_specs_are_one_line(spec, message):
    with pytest.raises(ValueError) as e:
        parse_prompt_spec(spec, 65536)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_bad_spec_files_are_one_line(tmp_path):
    cases = {
        "empty.txt": ("# nothing\n", "holds no prompt length"),
        "cols.csv": ("request,output\nr1,10\n", "no prompt-length column"),
        "float.txt": ("4096.0\n", "line 1: prompt length '4096.0' is not a whole number"),
        "gap.csv": ("prompt_len,weight\n4096,1\n,2\n", "line 3 has no prompt length"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError) as e:
            parse_prompt_spec(str(tmp_path / name))
        assert message in str(e.value), (name, str(e.value))


def test_a_long_trace_is_summed_in_bounded_memory(tmp_path, monkeypatch):
    import tracemalloc

    from ppprof.config import workload

    monkeypatch.setattr(workload, "BLOCK_ROWS", 1024)  # folds as a 10^7-row trace does, at a test's size
    num_rows = 30_000
    lens = np.random.default_rng(0).integers(100, 60000, num_rows)
    trace = tmp_path / "trace.csv"
    trace.write_text("request_id,input_len\n" + "".join(f"r{i},{n}\n" for i, n in enumerate(lens)))
    tracemalloc.start()
    try:
        w = parse_prompt_spec(str(trace), 65536)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * 2**20, f"{peak=}"  # every row kept (as before) took 17 MB
    ref = parse_prompt_spec(",".join(f"{n}:{c}" for n, c in zip(*np.unique(lens, return_counts=True))), 65536)
    assert w.prompt_lens == ref.prompt_lens and w.weights == pytest.approx(ref.weights)


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "4096\n" * 5 + "1" + "0" * 30 + "\n",
            "line 6: prompt length '1000000000000000000000000000000' is beyond 2147483647 tokens",
        ),  # was an OverflowError into int64
        ("input_len\n4096\n\n" + "x" * 70000 + "\n", "line 4 is longer than 65536 characters"),
        ("prompt_len,weight\n4096,1\n8192,-2\n", "line 3: weight -2 must be a positive finite number"),
        ("# only a comment\n", "holds no prompt length"),
    ],
)
def test_bad_trace_rows_are_named_by_line(tmp_path, text, message):
    (tmp_path / "t.csv").write_text(text)
    with pytest.raises(ValueError) as e:
        parse_prompt_spec(str(tmp_path / "t.csv"))
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
