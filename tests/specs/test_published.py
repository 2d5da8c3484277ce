"""The published models' own config.json (tests/specs/data/SOURCES.md): totals within 2% of the published ones,
exact KV bytes a token and Mamba-pool bytes a slot, per-stage accounting at PP4."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppprof.specs import load_spec, stage_accounts
from ppprof.specs.accounting import kv_bytes_per_token, mamba_bytes_per_slot, mtp_params
from tests.specs.helpers import memory_of

DATA = Path(__file__).parent / "data"
BF16 = 2

# folder -> (published total, published active a token, KV bytes a token in bf16)
PUBLISHED = {
    # DeepSeek-V3: 61 MLA layers, each a 512 latent + 64 RoPE key a token.
    "deepseek_v3": (671e9, 36.6e9, 61 * (512 + 64) * BF16),
    # Kimi-K2: the same MLA shapes (64 heads), 61 layers.
    "kimi_k2": (1.04e12, 32e9, 61 * (512 + 64) * BF16),
    # Qwen3-235B-A22B: 94 GQA layers of 4 KV heads of 128.
    "qwen3_moe": (235e9, 22e9, 94 * 2 * 4 * 128 * BF16),
    # Qwen3-Next-80B-A3B: only the 12 full-attention layers (2 KV heads of 256) keep KV.
    "qwen3_next": (80e9, 3e9, 12 * 2 * 2 * 256 * BF16),
    # DeepSeek-V2.5: 60 MLA layers.
    "deepseek_v2": (236e9, 21e9, 60 * (512 + 64) * BF16),
}


def totals(folder: str, pp_size: int = 4) -> tuple[int, int, list]:
    spec = load_spec(DATA / folder / "config.json")
    stages = stage_accounts(spec, pp_size, dtype="bfloat16")
    return sum(s.num_params["total"] for s in stages), sum(s.num_active_params for s in stages), stages


@pytest.mark.parametrize("folder", sorted(PUBLISHED))
def test_total_within_2_percent_and_exact_kv(folder):
    total, _, stages = totals(folder)
    published, _, kv = PUBLISHED[folder]
    assert abs(total / published - 1) < 0.02, f"{folder=} {total=:,} {published=:,}"
    assert sum(s.kv_bytes_per_token for s in stages) == kv, f"{folder=}"
    spec = load_spec(DATA / folder / "config.json")
    assert kv_bytes_per_token(spec, dtype="bf16") == kv


@pytest.mark.parametrize("folder", sorted(PUBLISHED))
def test_active_params_near_published(folder):
    """Active a token: DeepSeek-V3's 36.6B is its "activated, including the 0.9B output head" (no embedding), which
    ppprof counts the same way; the others publish a rounded figure (A22B, A3B, 32B): within 20%."""
    _, active, _ = totals(folder)
    published = PUBLISHED[folder][1]
    tolerance = 0.01 if folder == "deepseek_v3" else 0.2
    assert abs(active / published - 1) < tolerance, f"{folder=} {active=:,}"


def test_deepseek_v3_exact_counts():
    """671,026,419,200 by hand: 61 MLA layers of 187,107,328, 3 dense MLPs of 3*7168*18432, 58 MoE layers (router
    256*7168, its bias 256, 257 experts of 3*7168*2048), 2*61 norms + final norm, embedding and head 129280*7168."""
    total, _, stages = totals("deepseek_v3")
    mla = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    assert mla == 187_107_328
    expected = (
        61 * mla
        + 3 * 3 * 7168 * 18432
        + 58 * (256 * 7168 + 256 + 257 * 3 * 7168 * 2048)
        + (2 * 61 + 1) * 7168
        + 2 * 129280 * 7168
    )
    assert total == expected == 671_026_419_200
    spec = load_spec(DATA / "deepseek_v3" / "config.json")
    # The MTP module: counted, not in any stage (its embedding and head are the main model's).
    assert mtp_params(spec) == mla + 256 * 7168 + 256 + 257 * 3 * 7168 * 2048 + 2 * 7168 + 2 * 7168 * 7168 + 3 * 7168


def test_qwen3_next_state_bytes_per_slot():
    """Each of the 36 Gated DeltaNet layers: conv state (2*16*128 + 32*128) x 3 in bf16, recurrent state 32 x 128 x
    128 in fp32."""
    spec = load_spec(DATA / "qwen3_next" / "config.json")
    per_layer = 8192 * 3 * BF16 + 32 * 128 * 128 * 4
    assert mamba_bytes_per_slot(spec, dtype="bf16") == 36 * per_layer
    stages = stage_accounts(spec, 4, dtype="bfloat16")
    assert [s.mamba_bytes_per_slot for s in stages] == [9 * per_layer] * 4
    assert [s.kv_bytes_per_token for s in stages] == [3 * 2 * 2 * 256 * BF16] * 4


def test_partition_across_dense_and_moe_layers():
    """--layer-partition over DeepSeek-V3's 3 dense + 58 MoE layers: the stage of the dense layers is lighter."""
    spec = load_spec(DATA / "deepseek_v3" / "config.json")
    even = stage_accounts(spec, 4)
    uneven = stage_accounts(spec, 4, [17, 15, 15, 14])
    assert sum(s.num_params["total"] for s in uneven) == sum(s.num_params["total"] for s in even)
    assert uneven[0].layout == "L- x3 + LE x14"
    assert [s.layers.stop - s.layers.start for s in uneven] == [17, 15, 15, 14]
    moe_layer = stage_accounts(spec, 61)[5].num_params["total"]
    assert uneven[0].num_params["total"] - even[0].num_params["total"] == 1 * moe_layer


def test_model_command_json_across_dense_and_moe_layers():
    import json

    from click.testing import CliRunner

    from ppprof.cli import main

    r = CliRunner().invoke(
        main, ["model", str(DATA / "deepseek_v3"), "--pp", "4", "--layer-partition", "17,15,15,14", "--json"]
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["num_params"] == 671_026_419_200 and d["num_mtp_params"] == mtp_params(load_spec(DATA / "deepseek_v3"))
    assert [s["layout"] for s in d["stages"]] == ["L- x3 + LE x14", "LE x15", "LE x15", "LE x14"]
    assert sum(s["num_active_params"] for s in d["stages"]) == d["num_active_params"]
    assert {s["kv_bytes_per_token"] for s in d["stages"][1:3]} == {15 * 576 * BF16}


def test_memory_check_holds_the_experts_and_grows_with_the_prefix():
    from ppprof.specs.accounting import stage_weight_bytes
    from ppprof.specs.activation import mla_bytes

    spec = load_spec(DATA / "deepseek_v3" / "config.json")
    kw = dict(
        dtype="bfloat16",
        max_total_tokens=65536,
        page_size=64,
        max_mamba_cache_size=1,
        max_running_requests=8,
        context_len=65536,
        chunk_size=2048,
        attention_backend="sdpa",
        device="cuda",
    )
    layers = range(46, 61)
    m = memory_of(spec, layers, prefix_len=30720, **kw)
    assert m.weights == stage_weight_bytes(spec, layers, dtype="bfloat16") > 15 * 256 * 3 * 7168 * 2048 * BF16
    assert m.kv_pool == (65536 // 64 + 1) * 64 * 15 * 576 * BF16
    # MLA's decompression of the prefix: up to one prefix span (8192 tokens) every cached token costs its latent row,
    # its K/V and the padded V again; past it, only its latent row (the spans are decompressed one at a time).
    per_token = (512 + 64) + 128 * (128 + 128) + 2 * 128 * 192

    def mla(prefix_len):
        return mla_bytes(spec, 2048, 2048 + prefix_len, BF16, "sdpa", "cuda")

    assert mla(8192) - mla(0) == 8192 * per_token * BF16
    assert mla(30720) - mla(16384) == (30720 - 16384) * (512 + 64) * BF16
    assert m.activation_terms["attention"] == mla_bytes(spec, 2048, 2048 + 30720, BF16, "sdpa", "cuda")
    qwen = load_spec(DATA / "qwen3_next" / "config.json")
    q = memory_of(qwen, range(12), prefix_len=0, **{**kw, "max_mamba_cache_size": 64})
    assert q.mamba_pool == 65 * mamba_bytes_per_slot(qwen, range(12), dtype="bfloat16")
    # The MoE peak of a Qwen3-Next layer: routing over 512 experts, then the larger of one expert on every token and
    # the shared expert (here the same width, plus its output).
    from ppprof.specs.activation import ffn_bytes

    n, h = 2048, 2048
    routing = n * 512 * (BF16 + 12) + 48 * n * 10 + n * h * BF16
    assert ffn_bytes(qwen, qwen.layers[0], n, BF16) == routing + max(
        n * (3 * h + 4 * 512) * BF16, n * (4 * 512 + h) * BF16
    )
