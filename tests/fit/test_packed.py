"""The packed forwards' scoring: the additive form exact where the rows are additive, the cost of each extra piece
recovered exactly from rows it made (and a negative one or a factor not taken), packed.csv read (and refused in one
line), and `ppprof fit` reading the rows beside the samples, scoring them on the probes' own latencies too,
`validate` showing them and the serving simulation pricing with d."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.fit.packed import PackedRows, additive_ms, packed_forwards, read_packed
from ppprof.fit.synthetic import SyntheticProbes, SyntheticRun, make_samples, write_run_dir
from ppprof.policy import load
from ppprof.policy.rule import LatencyModel
from ppprof.serving.arms import packed_stage_ms
from ppprof.serving.scheduler import Batch, Piece

MODEL = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=4e-4)
PREFIXES = [[0, 8192], [32768, 0, 8192], [0, 0, 0, 8192], [8192, 0], [0, 8192, 8192, 0, 0, 32768, 0, 0]]
CHUNKS = [[1024, 4096], [64, 1024, 64], [64, 1024, 64, 4096], [4096, 64], [64, 1024, 64, 64, 64, 1024, 64, 64]]
"""Five packed forwards of 2 to 8 pieces, each piece a cell the synthetic samples below probe."""


def rows(measured=None, stage_ms=None, path="packed.csv") -> PackedRows:
    lens = tuple(np.array(p) for p in PREFIXES)
    chunks = tuple(np.array(x) for x in CHUNKS)
    base = PackedRows(lens, chunks, {0: np.ones(len(CHUNKS))}, Path(path))
    return PackedRows(lens, chunks, stage_ms or {0: measured(base)}, Path(path))


def pieces(r: PackedRows) -> np.ndarray:
    return r.pieces.astype(float)


def test_additive_rows_are_predicted_exactly_and_need_no_term():
    r = rows(lambda base: additive_ms(MODEL, base))
    out = packed_forwards(MODEL, r, 0)
    assert out["additive"] == {"mape": 0.0, "median_ape": 0.0, "worst_ape": 0.0}
    assert out["extra_piece"]["ms"] == pytest.approx(0.0, abs=1e-12) and out["extra_piece_ms"] == 0.0
    assert (out["forwards"], out["pieces"], out["stage"]) == (5, [2, 8], 0) and "additive_on_probes" not in out


def test_a_cost_per_extra_piece_is_recovered_exactly_and_kept():
    r = rows(lambda base: additive_ms(MODEL, base) + 0.75 * (pieces(base) - 1))
    out = packed_forwards(MODEL, r, 0)
    want = [0.75 * (n - 1) / (additive_ms(MODEL, r)[i] + 0.75 * (n - 1)) for i, n in enumerate(r.pieces)]
    assert out["additive"]["worst_ape"] == pytest.approx(max(want), rel=1e-12)
    d = out["extra_piece"]
    assert d["ms"] == pytest.approx(0.75, rel=1e-12) and d["stderr_ms"] == pytest.approx(0.0, abs=1e-12)
    assert d["worst_ape"] == pytest.approx(0.0, abs=1e-12)
    assert out["extra_piece_ms"] == pytest.approx(0.75) and out["why"].startswith("d 0.75 +- ")


def test_a_negative_cost_or_a_factor_is_not_taken():
    # A negative d would price a batch below the same batch without its shortest piece.
    out = packed_forwards(MODEL, rows(lambda base: additive_ms(MODEL, base) - 0.5 * (pieces(base) - 1)), 0)
    assert out["extra_piece"]["ms"] == pytest.approx(-0.5) and out["extra_piece_ms"] == 0.0
    assert "is negative: packed forwards ran below the additive form" in out["why"]
    # Packed forwards 10% cheaper in proportion: d cannot say it and lowers no median error enough to be kept.
    out = packed_forwards(MODEL, rows(lambda base: MODEL.c + 0.9 * (additive_ms(MODEL, base) - MODEL.c)), 0)
    assert out["additive"]["median_ape"] > 0.05 and out["extra_piece_ms"] == 0.0, f"{out=}"


def test_the_bottleneck_stage_is_scored_or_where_the_rows_lack_it_their_own_largest():
    additive = additive_ms(MODEL, rows(lambda base: np.ones(5)))
    r = rows(stage_ms={0: additive * 0.5, 1: additive})
    assert packed_forwards(MODEL, r, 1)["additive"]["worst_ape"] == pytest.approx(0.0, abs=1e-12)
    assert packed_forwards(MODEL, r, 0)["additive"]["median_ape"] == pytest.approx(1.0)  # predicted twice
    assert packed_forwards(MODEL, r, 3)["stage"] == packed_forwards(MODEL, r, None)["stage"] == 1


HEADER = "forward,pieces,tokens,prefix_lens,chunk_sizes,stage0_latency_ms,stage1_latency_ms\n"


def test_packed_csv_reads_each_forward_s_pieces_and_stages(tmp_path):
    path = tmp_path / "packed.csv"
    path.write_text(HEADER + "0,2,96,0 512,64 32,3.5,4.25\n1,3,40,128 0 0,8 16 16,2.0,1.5\n")
    r = read_packed(path)
    assert [list(x) for x in r.prefix_lens] == [[0, 512], [128, 0, 0]]
    assert [list(x) for x in r.chunk_sizes] == [[64, 32], [8, 16, 16]]
    assert list(r.pieces) == [2, 3] and list(r.stage_ms[1]) == [4.25, 1.5] and r.latency_ms(None)[0] == 1


@pytest.mark.parametrize(
    "text, message",
    [
        ("forward,prefix_lens,stage0_latency_ms\n0,0 0,1.0\n", "lacks column(s) chunk_sizes: write it with"),
        ("prefix_lens,chunk_sizes\n0 0,8 8\n", "lacks column(s) stage0_latency_ms"),
        ("prefix_lens,chunk_sizes,stage0_latency_ms\n", "lacks rows"),
        ("prefix_lens,chunk_sizes,stage0_latency_ms\n0 x,8 8,1.0\n", "column prefix_lens row 1 is '0 x': give"),
        ("prefix_lens,chunk_sizes,stage0_latency_ms\n0 -1,8 8,1.0\n", "column prefix_lens row 1 is '0 -1'"),
        ("prefix_lens,chunk_sizes,stage0_latency_ms\n0 0,8 99999999999999999999,1.0\n", "column chunk_sizes row 1"),
        ("prefix_lens,chunk_sizes,stage0_latency_ms\n0 0,8,1.0\n", "row 1: 2 prefix lengths for 1 chunk sizes"),
        ("prefix_lens,chunk_sizes,stage0_latency_ms\n0 0,8 0,1.0\n", "every chunk at least 1 token"),
        ("prefix_lens,chunk_sizes,stage0_latency_ms\n0 0,8 8,-1.0\n", "column stage0_latency_ms row 1: latencies"),
        (
            "prefix_lens,chunk_sizes,stage0_latency_ms\n0 0,8 8,nan\n",
            "column stage0_latency_ms row 1 is nan: use a finite",
        ),
    ],
)
def test_a_bad_packed_csv_is_one_line_naming_the_file_and_the_field(tmp_path, text, message):
    path = tmp_path / "packed.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^packed file {path} ") as e:
        read_packed(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def write_packed_csv(path: Path, extra_piece_ms: float) -> None:
    """Rows the synthetic samples' model makes (its bottleneck stage 0; stage 1 at 60%), d for each extra piece."""
    r = rows(lambda base: additive_ms(MODEL, base) + extra_piece_ms * (pieces(base) - 1))
    lines = [
        f"{k},{' '.join(map(str, L))},{' '.join(map(str, x))},{float(ms)!r},{0.6 * float(ms)!r}"
        for k, (L, x, ms) in enumerate(zip(r.prefix_lens, r.chunk_sizes, r.stage_ms[0]))
    ]
    path.write_text("forward,prefix_lens,chunk_sizes,stage0_latency_ms,stage1_latency_ms\n" + "\n".join(lines) + "\n")


def test_fit_reads_the_packed_rows_beside_the_samples_validate_shows_them_and_the_simulation_prices_with_d(tmp_path):
    frame = make_samples(
        MODEL, SyntheticProbes(base_chunk_size=4096, prefixes=[0, 8192, 32768], chunk_sizes=[64, 1024, 4096], noise=0.0)
    )
    samples = write_run_dir(tmp_path, frame, SyntheticRun(base_chunk_size=4096, min_gain=0.0))
    write_packed_csv(tmp_path / "packed.csv", extra_piece_ms=2.0)
    out = tmp_path / "policy.json"
    result = CliRunner().invoke(main, ["fit", str(samples), "-o", str(out)])
    assert result.exit_code == 0, result.output
    packed = json.loads(out.read_text())["report"]["packed_forwards"]
    assert packed["additive"]["worst_ape"] > 0.05 and packed["extra_piece_ms"] == pytest.approx(2.0, rel=1e-3)
    assert packed["extra_piece"]["worst_ape"] < 1e-3 and packed["source"] == str(tmp_path / "packed.csv")
    # Every piece's cell was probed (noise-free samples of the model): the same misses on the probes' latencies.
    assert packed["additive_on_probes"] == pytest.approx(packed["additive"], rel=1e-6)
    result = CliRunner().invoke(main, ["validate", str(out), "--verbose"])
    assert result.exit_code == 0 and "5 packed forwards held out: additive form median error" in result.output
    assert "; with 2 ms a piece beyond the first 0.0%, worst 0.0%" in result.output, result.output
    policy = load(out)
    assert policy.extra_piece_ms == pytest.approx(2.0, rel=1e-3)
    model = policy.planning_model
    batch = Batch(0, (Piece(0, 0, 512, last=True), Piece(1, 4096, 64, last=True), Piece(2, 0, 8, last=True)))
    alone = sum(float(model.chunk_latency_ms(p.prefix_len, p.size)) - model.c for p in batch.pieces) + model.c
    assert packed_stage_ms(model, 2, policy.extra_piece_ms)(batch) == pytest.approx([alone + 2 * 2.0] * 2, rel=1e-3)
    (tmp_path / "packed.csv").write_text("prefix_lens,chunk_sizes,stage0_latency_ms\n0,x,1.0\n")
    result = CliRunner().invoke(main, ["fit", str(samples), "-o", str(tmp_path / "other.json")])
    assert result.exit_code == 2 and "packed file" in result.output and not (tmp_path / "other.json").exists()
