"""Stage memory (ppprof.specs.memory): the pools and weights exactly as the real tensors, the activation model's
structure, and the whole estimate against the peak memory of a real forward on CPU (within 25%)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ppprof.bounds import MLA_PREFIX_SPAN_TOKENS
from ppprof.model.stage import Stage, build_stage_cache
from ppprof.specs import load_spec, split_layers
from ppprof.specs.activation import FLASHINFER_WORKSPACE_BYTES, attention_bytes, mamba_bytes, mla_bytes
from ppprof.specs.backends import MAMBA_FUSED, MAMBA_TORCH, resolve_backend
from ppprof.specs.memory import CacheSizes, format_bytes
from ppprof.specs.spec import LayerSpec, ModelSpec
from tests.specs.helpers import memory_of

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "benchmarks" / "memory.py"
TOLERANCE = 0.25


def hand_moe() -> ModelSpec:
    """Every kind of layer, attention and Mamba in parallel in one, a relu2 MLP and MoE."""
    layers = (
        LayerSpec(mixers=("mamba",)),
        LayerSpec(mixers=("attention", "mamba"), ffn="mlp"),
        LayerSpec(ffn="moe"),
        LayerSpec(mixers=("attention",), ffn="mlp"),
    )
    return ModelSpec(
        name="hand",
        family="falcon_h1",
        layers=layers,
        hidden_size=32,
        vocab_size=64,
        intermediate_size=48,
        mlp_act="relu2",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mamba_num_heads=4,
        mamba_head_dim=8,
        ssm_state_size=8,
        conv_kernel=4,
        mamba_n_groups=2,
        mamba_chunk_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
    )


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("spec", [load_spec("tiny-dense"), load_spec("tiny-hybrid"), hand_moe()], ids=lambda s: s.name)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_pools_and_weights_match_the_real_tensors_exactly(spec, dtype, page_size):
    sizes = dict(
        max_total_tokens=4 * 64, page_size=page_size, max_mamba_cache_size=5, max_running_requests=3, context_len=96
    )
    for layers in split_layers(spec.num_layers, 2) + [range(spec.num_layers)]:
        m = memory_of(spec, layers, dtype=dtype, chunk_size=32, prefix_len=64, **sizes)
        stage = Stage(spec, layers, dtype=getattr(torch, dtype))
        cache = build_stage_cache(spec, layers, CacheSizes(**sizes), dtype=getattr(torch, dtype))
        assert m.weights == nbytes(stage.parameters()), layers
        kv, mamba = cache.kv_pool, cache.mamba_pool
        assert m.kv_pool == (0 if kv is None else nbytes([*kv.k.values(), *kv.v.values()])), layers
        assert m.mamba_pool == (0 if mamba is None else nbytes([*mamba.conv.values(), *mamba.ssm.values()])), layers
        assert m.request_table == nbytes([cache.req_pool.req_to_token])
        assert m.running == m.weights + m.kv_pool + m.mamba_pool + m.request_table + m.activation_peak
        largest = max(p.numel() for p in stage.parameters())
        assert m.weights_init == 8 * largest and m.total == max(m.running, m.weights + m.weights_init)


def test_to_dict_holds_every_part_and_the_total():
    spec = load_spec("tiny-hybrid")
    m = memory_of(
        spec,
        range(4, 8),
        dtype=None,
        max_total_tokens=640,
        page_size=1,
        max_mamba_cache_size=8,
        max_running_requests=8,
        context_len=1024,
        chunk_size=128,
        prefix_len=512,
        stage_idx=1,
    )
    d = m.to_dict()
    assert d["stage_idx"] == 1 and (d["layer_start"], d["layer_stop"]) == (4, 8)
    assert d["dtype"] == "float32" and d["attention_backend"] == "sdpa" and d["mamba_kernel"] == MAMBA_TORCH
    assert d["running"] == sum(d[k] for k in ("weights", "kv_pool", "mamba_pool", "request_table", "activation_peak"))
    assert d["total"] == max(d["running"], d["weights"] + d["weights_init"])
    assert d["activation_peak"] == sum(d["activation_terms"].values())
    assert 4 <= d["activation_layer"] < 8


def test_auto_backend_and_the_mamba_kernel_follow_the_device(monkeypatch):
    import ppprof.specs.backends as memory

    assert resolve_backend("auto", "cpu") == "sdpa"
    monkeypatch.setattr(memory.importlib.util, "find_spec", lambda name: object())
    assert resolve_backend("auto", "cuda") == "flashinfer" and memory.mamba_kernel("cuda") == MAMBA_FUSED
    assert memory.mamba_kernel("cpu") == MAMBA_TORCH
    monkeypatch.setattr(memory.importlib.util, "find_spec", lambda name: None)
    assert resolve_backend("auto", "cuda") == "sdpa" and memory.mamba_kernel("cuda") == MAMBA_TORCH
    with pytest.raises(ValueError, match="flashinfer runs on CUDA only"):
        resolve_backend("flashinfer", "cpu")
    with pytest.raises(ValueError, match="--attention-backend 'fast' is unknown"):
        resolve_backend("fast", "cpu")


def test_the_activation_model_ranks_the_kernels_as_their_memory_does():
    spec = load_spec("nemotron-h-8b")
    n, total = 10240, 10240 + 65536
    cpu, cuda = attention_bytes(spec, n, total, 2, "sdpa", "cpu"), attention_bytes(spec, n, total, 2, "sdpa", "cuda")
    flashinfer, reference = (attention_bytes(spec, n, total, 2, b, "cuda") for b in ("flashinfer", "reference"))
    assert flashinfer < cuda < cpu < reference
    assert reference > 32 * n * total * 9, "the math path holds fp32 scores, their softmax and a bool test"
    # The SSD's decay tensors (heads, blocks, q, q) dominate the torch path; the fused kernels never build them.
    fused, torch_ssd = mamba_bytes(spec, n, 2, MAMBA_FUSED), mamba_bytes(spec, n, 2, MAMBA_TORCH)
    assert fused < torch_ssd - 3 * 128 * n * 128 * 2
    # Twice the chunk: the attention and Mamba transients grow at least linearly.
    assert mamba_bytes(spec, 2 * n, 2, MAMBA_TORCH) >= 2 * mamba_bytes(spec, n, 2, MAMBA_TORCH) - 2**20
    assert attention_bytes(spec, n, 2 * total, 2, "sdpa", "cpu") > cpu


def test_the_largest_layer_wins_and_flashinfer_adds_its_workspace():
    spec = load_spec("nemotron-h-8b")
    sizes = dict(
        dtype="bfloat16",
        max_total_tokens=75776,
        page_size=64,
        max_mamba_cache_size=128,
        max_running_requests=128,
        context_len=131072,
        chunk_size=10240,
        prefix_len=65536,
        device="cuda",
    )
    sdpa = memory_of(spec, range(13), attention_backend="sdpa", **sizes)
    reference = memory_of(spec, range(13), attention_backend="reference", **sizes)
    assert spec.layers[sdpa.activation_layer].has_mamba and "mamba" in sdpa.activation_terms
    assert spec.layers[reference.activation_layer].has_attention and "attention" in reference.activation_terms
    assert reference.activation_peak > 100 * 2**30, "dense fp32 scores of 32 heads x 10240 x 75776"
    assert sdpa.weights == reference.weights and sdpa.kv_pool == reference.kv_pool
    mamba_only = memory_of(spec, range(2), attention_backend="sdpa", **sizes)
    assert mamba_only.kv_pool == 0 and "attention" not in mamba_only.activation_terms
    assert mamba_only.activation_terms["prefix_noise"] > 0, "one Mamba slot of random state"


def test_mla_counts_one_span_of_a_long_prefix_not_the_whole_prefix():
    """Past MLA_PREFIX_SPAN_TOKENS cached tokens only the rows read from the pool grow with the prefix (c + dr a
    token); up to it, the whole prefix is decompressed at once, as before; the dense-mask oracle never spans."""
    spec = load_spec(Path(__file__).parent / "data" / "deepseek_v3" / "config.json")
    n, p, b, latent = 8192, MLA_PREFIX_SPAN_TOKENS, 2, spec.mla_latent_dim

    def term(prefix_len, backend="sdpa", span=p):
        return mla_bytes(spec, n, prefix_len + n, b, backend, "cuda", span)

    assert term(4 * p) - term(2 * p) == 2 * p * latent * b
    assert term(p) == term(p, span=10 * p)  # one span: the whole prefix at once
    assert term(p + 1) < term(p + 1, span=10 * p)
    assert term(131072, "reference") == term(131072, "reference", span=10**6)
    whole, spanned = term(131072, span=10**6), term(131072)
    assert spanned * 6 < whole, f"{format_bytes(spanned)=} {format_bytes(whole)=}"


def test_bad_sizes_name_the_setting():
    spec = load_spec("tiny-dense")
    sizes = dict(
        dtype=None,
        page_size=16,
        max_mamba_cache_size=1,
        max_running_requests=1,
        context_len=64,
        chunk_size=16,
        prefix_len=0,
    )
    with pytest.raises(ValueError, match="--max-total-tokens 100 must be a positive multiple of --page-size 16"):
        memory_of(spec, range(4), max_total_tokens=100, **sizes)
    with pytest.raises(ValueError, match="--max-running-requests 0 must be an integer >= 1"):
        memory_of(spec, range(4), max_total_tokens=64, **{**sizes, "max_running_requests": 0})
    with pytest.raises(ValueError, match="layer_ids range"):
        memory_of(spec, range(2, 9), max_total_tokens=64, **sizes)


def test_format_bytes():
    assert [format_bytes(n) for n in (512, 1536, 3 * 2**20, 2**31, 5 * 2**40)] == [
        "512 B",
        "1.5 KiB",
        "3.0 MiB",
        "2.0 GiB",
        "5.0 TiB",
    ]


def load_bench():
    """scripts/benchmarks/memory.py as a module (its measurement runs in a fresh Python)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_memory", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc (VmHWM, clear_refs)")
@pytest.mark.parametrize(
    ("model", "backend", "base_chunk_size"),
    # Each model, each backend and two B: the reference backend's dense scores on the hybrid model at B = 1024 (a
    # 1.9 GiB peak, 7 s; at 2048 a 3.7 GiB peak took 33 s of the suite on a host that backs fresh pages slowly). The
    # benchmark (scripts/benchmarks/memory.py, results/bench_memory.json) measures every case.
    [("tiny-dense", "sdpa", 512), ("tiny-hybrid", "sdpa", 2048), ("tiny-hybrid", "reference", 1024)],
)
def test_the_estimate_is_within_25_percent_of_the_measured_peak(model, backend, base_chunk_size):
    """One forward of the largest probe request of a profile with base chunk B (chunk 1.25 B after 4 B cached
    tokens), the whole model as one stage, fp32, in a fresh Python (scripts/benchmarks/memory.py): its peak RSS above the
    RSS before the stage was built, against the estimate's total. glibc is told to map every block above 128 KiB on
    its own (MALLOC_MMAP_THRESHOLD_), so that RSS follows the live tensors rather than the heap's layout, which
    moves the peak by up to ~30% from run to run. The sizes keep the modelled bytes at tens of MiB and more (the
    profile's default request table alone is 32 MiB) against a few MiB of page-granular noise; the reference
    backend's dense scores make tiny-hybrid's peak about 1.9 GiB at B = 1024 (tiny-dense's, the same term, is left
    out: on a VM that backs fresh pages at ~4 s a GiB it took 53 s of the suite). Each case takes 2-7 s here."""
    row = load_bench().measure_in_fresh_python(model, backend, base_chunk_size, "exact", timeout_s=60)
    assert row["measured"] > 30 * 2**20, row
    assert abs(row["estimate"] - row["measured"]) <= TOLERANCE * row["measured"], (
        f"estimate {format_bytes(row['estimate'])} vs measured {format_bytes(row['measured'])}: {row}"
    )


def test_the_flashinfer_workspace_is_counted_on_every_stage():
    spec = load_spec("tiny-dense")
    m = memory_of(
        spec,
        range(4),
        dtype=None,
        max_total_tokens=64,
        page_size=16,
        max_mamba_cache_size=1,
        max_running_requests=1,
        context_len=64,
        chunk_size=16,
        prefix_len=16,
        attention_backend="flashinfer",
        device="cuda",
    )
    assert m.activation_terms["flashinfer_workspace"] == FLASHINFER_WORKSPACE_BYTES
    assert m.dtype == "bfloat16", "bf16 on CUDA when neither --dtype nor the spec says"
