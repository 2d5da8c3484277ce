"""The GPU paths against their oracles, on CUDA only (skipped elsewhere; scripts/gpu_check.sh runs them on a GPU):
SDPA's fast path, FlashInfer's paged prefill, the fused Mamba kernels and fla's delta rule against the reference /
torch paths; the MLA, MoE and Gated DeltaNet presets chunked == one shot."""

import pytest
import torch

from ppprof.model.attention_kernels import AttentionKernel, flashinfer_available, reference_attention, sdpa_attention
from ppprof.model.mamba import MambaKernel, fused_mamba_available, ssd_chunked

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")
TOL = {
    torch.float32: dict(rtol=1e-4, atol=1e-4),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
    torch.float16: dict(rtol=5e-3, atol=5e-3),
}


def paged_inputs(num_heads, num_kv_heads, head_dim, prefix_len, n, page_size, dtype, seed=0):
    """q of the chunk and K/V of every position in a paged buffer: the request's pages shuffled, the rest garbage."""
    gen = torch.Generator().manual_seed(seed)
    total = prefix_len + n
    num_pages = -(-total // page_size)
    pool_pages = num_pages + 8
    pages = torch.randperm(pool_pages - 1, generator=gen)[:num_pages] + 1  # page 0 reserved
    slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:total]
    k_buf = torch.randn(pool_pages * page_size, num_kv_heads, head_dim, generator=gen) * 50
    v_buf = torch.randn(pool_pages * page_size, num_kv_heads, head_dim, generator=gen) * 50
    k_buf[slots] = torch.randn(total, num_kv_heads, head_dim, generator=gen)
    v_buf[slots] = torch.randn(total, num_kv_heads, head_dim, generator=gen)
    q = torch.randn(n, num_heads, head_dim, generator=gen)
    return [t.to(CUDA, dtype) for t in (q, k_buf, v_buf)] + [slots.to(CUDA)]


CASES = [
    (32, 8, 128, 0, 512),
    (32, 8, 128, 4096, 1),
    (32, 8, 128, 8192, 2048),
    (32, 32, 64, 1000, 333),
    (40, 8, 128, 70, 7),
]


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,prefix_len,n", CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_sdpa_fast_path_equals_the_reference_on_cuda(num_heads, num_kv_heads, head_dim, prefix_len, n, dtype):
    q, k_buf, v_buf, slots = paged_inputs(num_heads, num_kv_heads, head_dim, prefix_len, n, 1, dtype)
    got, kernel = sdpa_attention(q, k_buf, v_buf, slots, prefix_len)
    want, _ = reference_attention(q.float(), k_buf.float(), v_buf.float(), slots, prefix_len)
    torch.testing.assert_close(got.float(), want, **TOL[dtype])
    if dtype != torch.float32:
        assert kernel in ("flash", "efficient"), f"{kernel=}"


@pytest.mark.skipif(not flashinfer_available(), reason="flashinfer is not installed")
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,prefix_len,n", CASES)
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_flashinfer_paged_prefill_equals_the_reference(num_heads, num_kv_heads, head_dim, prefix_len, n, page_size):
    q, k_buf, v_buf, slots = paged_inputs(num_heads, num_kv_heads, head_dim, prefix_len, n, page_size, torch.bfloat16)
    kernel = AttentionKernel("flashinfer", CUDA)
    got = kernel(q, k_buf, v_buf, slots, prefix_len, page_size=page_size, chunk_id=(0, 0, prefix_len, n))
    want, _ = reference_attention(q.float(), k_buf.float(), v_buf.float(), slots, prefix_len)
    torch.testing.assert_close(got.float(), want, **TOL[torch.bfloat16])


@pytest.mark.skipif(not fused_mamba_available("cuda"), reason="mamba_ssm / causal_conv1d are not installed")
@pytest.mark.parametrize("seq_len", [1, 100, 2048])
def test_fused_mamba_kernels_equal_the_torch_path(seq_len):
    gen = torch.Generator().manual_seed(seq_len)
    heads, head_dim, groups, d_state, channels, width = 16, 64, 2, 64, 256, 4
    x = torch.randn(seq_len, heads, head_dim, generator=gen).to(CUDA, torch.bfloat16)
    dt = torch.nn.functional.softplus(torch.randn(seq_len, heads, generator=gen) - 2).to(CUDA)
    a = (-torch.rand(heads, generator=gen) * 4 - 0.5).to(CUDA)
    b, c = (torch.randn(seq_len, groups, d_state, generator=gen).to(CUDA, torch.bfloat16) for _ in range(2))
    state = torch.randn(heads, head_dim, d_state, generator=gen).to(CUDA)
    fused = MambaKernel(CUDA)
    y, final = fused.scan(x, dt, a, b, c, 128, state)
    y_ref, final_ref = ssd_chunked(x.float(), dt, a, b.float(), c.float(), 128, initial_state=state)
    torch.testing.assert_close(y, y_ref, rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(final, final_ref, rtol=5e-2, atol=5e-2)
    xbc = torch.randn(seq_len, channels, generator=gen).to(CUDA, torch.bfloat16)
    conv_state = torch.randn(channels, width - 1, generator=gen).to(CUDA, torch.bfloat16)
    weight = torch.randn(channels, width, generator=gen).to(CUDA, torch.bfloat16)
    bias = torch.randn(channels, generator=gen).to(CUDA, torch.bfloat16)
    torch_path = MambaKernel(torch.device("cpu"))
    for got, want in zip(fused.conv(xbc, conv_state, weight, bias), torch_path.conv(xbc, conv_state, weight, bias)):
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_a_stage_on_cuda_prefilled_in_chunks_equals_one_shot():
    from ppprof.mem.cache import Request
    from ppprof.model.stage import Stage, build_stage_cache
    from ppprof.specs.memory import CacheSizes
    from tests.model.helpers import tiny_hybrid

    spec = tiny_hybrid()
    layers = range(spec.num_layers)
    tokens = torch.randint(spec.vocab_size, (96,), generator=torch.Generator().manual_seed(0)).to(CUDA)
    out = []
    for chunks in ([96], [40, 1, 55]):
        stage = Stage(spec, layers, dtype=torch.float32, device=CUDA, seed=0, attention_backend="sdpa")
        cache = build_stage_cache(
            spec,
            layers,
            CacheSizes(
                max_total_tokens=256, page_size=16, max_mamba_cache_size=2, max_running_requests=2, context_len=256
            ),
            dtype=torch.float32,
            device=CUDA,
        )
        req, done = Request(0), 0
        assert cache.admit(req)
        for n in chunks:
            cache.extend(req, n)
            logits, _ = stage(cache, req, tokens[done : done + n], None, done)
            done += n
        out.append(logits)
    torch.testing.assert_close(out[1], out[0], rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(
    not __import__("ppprof.model.deltanet", fromlist=["fla_available"]).fla_available("cuda"),
    reason="flash-linear-attention is not installed",
)
@pytest.mark.parametrize("seq_len", [1, 100, 2048])
def test_fla_delta_rule_equals_the_torch_path(seq_len):
    from ppprof.model.deltanet import DeltaNetKernel, chunk_gated_delta_rule

    gen = torch.Generator().manual_seed(seq_len)
    heads, dk, dv = 8, 128, 128
    q = torch.nn.functional.normalize(torch.randn(seq_len, heads, dk, generator=gen), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(torch.randn(seq_len, heads, dk, generator=gen), dim=-1)
    v = torch.randn(seq_len, heads, dv, generator=gen)
    g, beta = -torch.rand(seq_len, heads, generator=gen), torch.rand(seq_len, heads, generator=gen)
    state = torch.randn(heads, dk, dv, generator=gen) * 0.1
    args = [t.to(CUDA) for t in (q, k, v.bfloat16(), g, beta)]
    o, final = DeltaNetKernel(CUDA)(*args, 64, state.to(CUDA))
    o_ref, final_ref = chunk_gated_delta_rule(*(t.float() for t in args), 64, state.to(CUDA))
    torch.testing.assert_close(o, o_ref, rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(final, final_ref, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("preset", ["tiny-mla", "tiny-moe", "tiny-gdn"])
def test_the_new_presets_on_cuda_prefilled_in_chunks_equal_one_shot(preset):
    from ppprof.mem.cache import Request
    from ppprof.model.stage import Stage, build_stage_cache
    from ppprof.specs import load_spec
    from ppprof.specs.memory import CacheSizes

    spec = load_spec(preset)
    layers = range(spec.num_layers)
    tokens = torch.randint(spec.vocab_size, (130,), generator=torch.Generator().manual_seed(0)).to(CUDA)
    out = []
    for chunks in ([130], [40, 1, 89]):
        stage = Stage(spec, layers, dtype=torch.float32, device=CUDA, seed=0, attention_backend="sdpa")
        cache = build_stage_cache(
            spec,
            layers,
            CacheSizes(
                max_total_tokens=256, page_size=16, max_mamba_cache_size=2, max_running_requests=2, context_len=256
            ),
            dtype=torch.float32,
            device=CUDA,
        )
        req, done = Request(0), 0
        assert cache.admit(req)
        for n in chunks:
            cache.extend(req, n)
            logits, _ = stage(cache, req, tokens[done : done + n], None, done)
            done += n
        out.append(logits)
    torch.testing.assert_close(out[1], out[0], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("absorb", [False, True])
def test_mla_prefix_spans_on_cuda_equal_the_dense_mask_reference(dtype, absorb):
    """DeepSeek-V3's head shapes (8 heads of a TP rank): a 3000-token prefix in spans of 1024 through the
    memory-efficient kernel's log-sum-exp, against the whole prefix under a dense mask."""
    from ppprof.model.mla import Attend, mla_absorbed, mla_decompressed

    gen = torch.Generator().manual_seed(0)
    n, prefix_len, heads, dn, dr, dv, c = 256, 3000, 8, 128, 64, 128, 512
    q_nope, q_rope = torch.randn(n, heads, dn, generator=gen), torch.randn(n, heads, dr, generator=gen)
    latent, k_rope = torch.randn(prefix_len + n, c, generator=gen), torch.randn(prefix_len + n, dr, generator=gen)
    w = torch.randn(heads * (dn + dv), c, generator=gen) * c**-0.5
    args = [t.to(CUDA, dtype) for t in (q_nope, q_rope, latent, k_rope, w)]
    form, scale = (mla_absorbed if absorb else mla_decompressed), (dn + dr) ** -0.5
    spans = form(*args, Attend(prefix_len, scale, span_len=1024))
    reference = form(*args, Attend(prefix_len, scale, reference=True))
    torch.testing.assert_close(spans.float(), reference.float(), **TOL[dtype])
