"""Mamba2 mixer in pure torch: causal conv and chunked SSD scan, both resumed from and written back to the request's
Mamba slot, so a prompt prefilled chunk by chunk ends in the same state as one prefilled at once."""

from __future__ import annotations

import importlib.util
import math

import torch
import torch.nn.functional as F
from torch import nn

from ppprof.mem.cache import Request, StageCache
from ppprof.model.tp import NO_TP, TPComm, assign, full_shape, mark_segments
from ppprof.specs.spec import ModelSpec
from ppprof.specs.tp import rank_shapes


def segsum(x: torch.Tensor) -> torch.Tensor:
    """Segment sums of the last axis. x: (..., T) -> (..., T, T) with out[..., i, j] = x[j+1] + ... + x[i] for j <= i
    (0 on the diagonal) and -inf above it, so exp(out) is the lower-triangular decay matrix.

    Built from masked cumulative sums rather than cumsum differences, which lose precision when cumsums are large.
    """
    t = x.shape[-1]
    x = x[..., None].expand(*x.shape, t)  # (..., T, T): x[..., k, j] = x[k]
    strictly_lower = torch.ones(t, t, dtype=torch.bool, device=x.device).tril(-1)
    x = x.masked_fill(~strictly_lower, 0.0)
    out = x.cumsum(dim=-2)  # out[i, j] = sum over k in (j, i] of x[k]
    lower = torch.ones(t, t, dtype=torch.bool, device=x.device).tril(0)
    return out.masked_fill(~lower, -math.inf)


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    block_len: int,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSD scan of one sequence, computed block by block (Mamba2's "SSD minimal" structure).

    Recurrence it computes, per head h:  state_t = exp(dt_t a_h) state_{t-1} + dt_t x_t B_t^T,  y_t = state_t C_t.
    x: (L, heads, head_dim); dt: (L, heads) (after softplus); a: (heads,) (negative); b, c: (L, groups, d_state);
    initial_state: (heads, head_dim, d_state) or None (zeros).
    Returns y: (L, heads, head_dim) and the final state (heads, head_dim, d_state), both fp32.
    A length that is not a multiple of block_len is padded with dt = 0 steps: their decay is exp(0) = 1 and their
    input is 0, so they leave the state unchanged and their outputs are dropped.
    Precision, as the fused kernels do it: dt, A, the log-decays and the states stay fp32; the contractions with x,
    B and C (the bulk of the work) run in x's dtype when that is bf16 or fp16, else in fp32.
    """
    seq_len = x.shape[0]
    x, b, c, a_dt = ssd_blocks(x, dt, a, b, c, block_len)
    cdt = x.dtype
    num_blocks, q, num_heads, head_dim = x.shape
    a_cumsum = a_dt.cumsum(dim=-1)  # (heads, blocks, q): log-decay from each block's start

    # 1. Intra-block (diagonal blocks): y_l = sum_{s <= l} C_l . B_s  exp(a_s+1 + ... + a_l)  x_bar_s,
    #    the quadratic "attention-like" form with the decay matrix L = exp(segsum(a_dt)).
    decay = torch.exp(segsum(a_dt)).to(cdt)  # (heads, blocks, q, q)
    y_diag = torch.einsum("klhn,kshn,hkls,kshp->klhp", c, b, decay, x)  # (blocks, q, heads, head_dim)

    # 2. Each block's own final state (from a zero start): sum_s exp(a_cumsum[-1] - a_cumsum[s]) x_bar_s B_s^T.
    decay_to_end = torch.exp(a_cumsum[..., -1:] - a_cumsum)  # (heads, blocks, q), fp32
    block_states = torch.einsum("klhn,hkl,klhp->khpn", b.float(), decay_to_end, x.float())  # (blocks, heads, hd, n)

    # 3. Inter-block recurrence: the state entering each block, and the final state.
    entry_states, final_state = ssd_entry_states(block_states, a_cumsum, initial_state)

    # 4. State -> output: the entering state's contribution inside each block, y_l += exp(a_cumsum[l]) S_k C_l.
    decay_from_start = torch.exp(a_cumsum).to(cdt)  # (heads, blocks, q)
    y_off = torch.einsum("klhn,khpn,hkl->klhp", c, entry_states.to(cdt), decay_from_start)  # (blocks, q, heads, hd)

    y = (y_diag.float() + y_off.float()).reshape(num_blocks * q, num_heads, head_dim)[:seq_len]  # (L, heads, hd)
    return y, final_state


def ssd_blocks(
    x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, block_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """ssd_chunked's inputs cast (dt and a fp32, x, B and C to the contraction dtype), B and C repeated from groups to
    heads, padded to whole blocks, discretized (x_bar = dt * x, a_bar = dt * a) and cut into blocks of block_len
    steps. Returns x_bar, B, C: (blocks, q, heads, .), and the log-decays a_dt: (heads, blocks, q), fp32."""
    seq_len, num_heads, head_dim = x.shape
    num_groups, d_state = b.shape[1], b.shape[2]
    cdt = x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.float32
    dt, a = dt.float(), a.float()
    x, b, c = x.to(cdt), b.to(cdt), c.to(cdt)
    heads_per_group = num_heads // num_groups
    b = b.repeat_interleave(heads_per_group, dim=1)  # (L, heads, d_state)
    c = c.repeat_interleave(heads_per_group, dim=1)  # (L, heads, d_state)
    pad = -seq_len % block_len
    if pad:  # F.pad lists dims last to first: this pads only the time axis (dim 0), at its end
        x, dt, b, c = (F.pad(t, (0,) * (2 * t.dim() - 1) + (pad,)) for t in (x, dt, b, c))
    num_blocks = (seq_len + pad) // block_len
    q = block_len
    x = (x.float() * dt[..., None]).to(cdt).view(num_blocks, q, num_heads, head_dim)  # (blocks, q, heads, head_dim)
    b = b.view(num_blocks, q, num_heads, d_state)  # (blocks, q, heads, d_state)
    c = c.view(num_blocks, q, num_heads, d_state)  # (blocks, q, heads, d_state)
    a_dt = (dt * a).T.reshape(num_heads, num_blocks, q)  # (heads, blocks, q)
    return x, b, c, a_dt


def ssd_entry_states(
    block_states: torch.Tensor, a_cumsum: torch.Tensor, initial_state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The inter-block recurrence of ssd_chunked: the state entering block k is
    S_k = sum_{j <= k} exp(total decay of blocks j..k-1) s_j, with s_0 the initial state (zeros when None) and s_j
    (j >= 1) the state block j-1 built from a zero start (block_states: (blocks, heads, head_dim, d_state)); the entry
    for k = blocks is the final state. Returns the entering states (blocks, heads, head_dim, d_state) and the final
    state (heads, head_dim, d_state), fp32."""
    if initial_state is None:
        _, num_heads, head_dim, d_state = block_states.shape
        initial_state = torch.zeros(num_heads, head_dim, d_state, dtype=torch.float32, device=block_states.device)
    states = torch.cat([initial_state.float()[None], block_states], dim=0)  # (blocks + 1, heads, head_dim, d_state)
    block_decay = torch.exp(segsum(F.pad(a_cumsum[..., -1], (1, 0))))  # (heads, blocks + 1, blocks + 1)
    states = torch.einsum("hzk,khpn->zhpn", block_decay, states)  # (blocks + 1, heads, head_dim, d_state)
    return states[:-1], states[-1]


def causal_conv(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv1d that resumes from the last kernel-1 inputs of the previous chunk.

    x: (n, channels); conv_state: (channels, kernel - 1); weight: (channels, kernel); bias: (channels,).
    Returns the output (n, channels) (before activation) and the new state (channels, kernel - 1).
    """
    kernel = weight.shape[1]
    seq = torch.cat([conv_state.to(x.dtype), x.T], dim=1)  # (channels, kernel - 1 + n)
    out = F.conv1d(seq[None], weight[:, None, :], bias, groups=weight.shape[0])  # (1, channels, n)
    return out[0].T, seq[:, seq.shape[1] - (kernel - 1) :]


MAMBA_TORCH = "torch SSD (states fp32, contractions in the pipeline dtype)"
MAMBA_FUSED = "mamba_ssm chunk scan + causal_conv1d"


def fused_mamba_available(device_type: str) -> bool:
    """mamba_ssm's chunked scan and causal_conv1d run on CUDA when both packages are importable (ppprof[gpu])."""
    return device_type == "cuda" and all(
        importlib.util.find_spec(m) is not None for m in ("mamba_ssm", "causal_conv1d")
    )


class MambaKernel:
    """The causal conv and the SSD scan of a stage's Mamba layers: the fused CUDA kernels servers run when they are
    importable, else the torch path above. `kernel` says which."""

    def __init__(self, device: torch.device) -> None:
        self.fused = fused_mamba_available(device.type)
        self.kernel = MAMBA_FUSED if self.fused else MAMBA_TORCH

    def conv(
        self, xbc: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """SiLU(causal conv) resumed from conv_state. xbc: (n, channels) -> (n, channels), new state."""
        if not self.fused:
            out, state = causal_conv(xbc, conv_state, weight, bias)
            return F.silu(out), state
        from causal_conv1d import causal_conv1d_fn

        # causal_conv1d takes x and the initial state channel-last: (1, channels, n) with stride 1 along channels.
        initial = conv_state.to(xbc.dtype).t().contiguous().t()[None]  # (1, channels, kernel - 1)
        out, state = causal_conv1d_fn(
            xbc.contiguous().t()[None],
            weight,
            bias,
            initial_states=initial,
            return_final_states=True,
            activation="silu",
        )
        return out[0].t(), state[0]

    def scan(self, x, dt, a, b, c, block_len: int, initial_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ssd_chunked's arguments and results (y fp32, final state fp32)."""
        if not self.fused:
            return ssd_chunked(x, dt, a, b, c, block_len, initial_state=initial_state)
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

        y, state = mamba_chunk_scan_combined(
            x[None],
            dt[None],
            a,
            b[None],
            c[None],
            chunk_size=block_len,
            initial_states=initial_state[None],
            return_final_states=True,
        )
        return y[0].float(), state[0].float()


class Mamba2(nn.Module):
    """in_proj -> (z, xBC, dt); causal conv + SiLU on xBC; SSD scan with D skip; gated RMSNorm with z; out_proj.

    Under TP, as SGLang's MambaMixer2 splits it: this rank's heads (z, x, dt, A, D, the norm's channels) and its
    groups of B and C (split where there are at least as many groups as TP ranks, else the rank's one group
    replicated), in_proj and the conv column-parallel, out_proj row-parallel, then the all-reduce. Where a norm group
    spans ranks (fewer groups than TP ranks), its sum of squares is all-reduced first."""

    def __init__(
        self,
        spec: ModelSpec,
        layer_id: int,
        *,
        dtype: torch.dtype,
        device: str | torch.device,
        kernel: MambaKernel | None = None,
        tp: TPComm = NO_TP,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.kernel = kernel or MambaKernel(torch.device(device))
        self.tp = tp
        shapes = rank_shapes(spec, tp.size, tp.rank)
        heads, groups = shapes.mamba_heads, shapes.mamba_groups
        self.num_heads = heads.size
        self.head_dim = spec.mamba_head_dim
        self.d_state = spec.ssm_state_size
        self.num_groups = groups.size
        self.group_idx = groups.start
        self.d_inner = self.num_heads * self.head_dim
        self.conv_dim = self.d_inner + 2 * self.num_groups * self.d_state
        self.norm_group_size = spec.mamba_d_inner // spec.mamba_n_groups
        """Channels one gated-RMSNorm group normalises (of the whole layer: a group may span TP ranks)."""
        self.norm_spans_ranks = spec.mamba_n_groups < tp.size
        self.num_norm_groups = spec.mamba_n_groups
        self.block_len = spec.mamba_chunk_size
        self.eps = spec.rms_norm_eps
        kw = dict(dtype=dtype, device=device)
        self.in_proj = nn.Linear(spec.hidden_size, self.d_inner + self.conv_dim + self.num_heads, bias=False, **kw)
        self.conv_weight = nn.Parameter(torch.empty(self.conv_dim, spec.conv_kernel, **kw))
        self.conv_bias = nn.Parameter(torch.empty(self.conv_dim, **kw))
        # A, dt bias and D stay fp32, as in the reference implementation: they enter exp/softplus on every step.
        self.a_log = nn.Parameter(torch.empty(self.num_heads, dtype=torch.float32, device=device))
        self.dt_bias = nn.Parameter(torch.empty(self.num_heads, dtype=torch.float32, device=device))
        self.d_skip = nn.Parameter(torch.empty(self.num_heads, dtype=torch.float32, device=device))
        self.norm_weight = nn.Parameter(torch.empty(self.d_inner, **kw))
        self.out_proj = nn.Linear(self.d_inner, spec.hidden_size, bias=False, **kw)
        hd, n = self.head_dim, self.d_state
        xbc = [(heads, hd), (groups, n), (groups, n)]
        mark_segments(self.in_proj.weight, [(heads, hd), *xbc, (heads, 1)], dim=0)  # z, x, B, C, dt
        for p in (self.conv_weight, self.conv_bias):
            mark_segments(p, xbc, dim=0)
        for p in (self.a_log, self.dt_bias, self.d_skip):
            mark_segments(p, [(heads, 1)], dim=0)
        mark_segments(self.norm_weight, [(heads, hd)], dim=0)
        mark_segments(self.out_proj.weight, [(heads, hd)], dim=1)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator, std: float) -> None:
        """Random weights drawn from `generator` (CPU), in a fixed order, at the full (TP = 1) shapes, this rank
        keeping its shard; the SSM parameters in Mamba2's init ranges."""
        num_heads = full_shape(self.a_log)[0]
        draw = assign
        draw(self.in_proj.weight, torch.randn(full_shape(self.in_proj.weight), generator=generator) * std)
        conv_shape = full_shape(self.conv_weight)
        draw(self.conv_weight, torch.randn(conv_shape, generator=generator) / math.sqrt(conv_shape[1]))
        draw(self.conv_bias, torch.zeros(conv_shape[0]))
        draw(self.a_log, torch.empty(num_heads).uniform_(1.0, 16.0, generator=generator).log())  # A in [-16, -1]
        dt = torch.empty(num_heads).uniform_(math.log(1e-3), math.log(1e-1), generator=generator).exp()
        draw(self.dt_bias, dt + torch.log(-torch.expm1(-dt)))  # inverse softplus: softplus(dt_bias) = dt
        draw(self.d_skip, torch.ones(num_heads))
        draw(self.norm_weight, torch.ones(full_shape(self.norm_weight)))
        draw(self.out_proj.weight, torch.randn(full_shape(self.out_proj.weight), generator=generator) * std)

    def forward(self, x: torch.Tensor, cache: StageCache, req: Request) -> torch.Tensor:
        """x: (n, hidden), the request's next n tokens -> (n, hidden). Reads and rewrites the conv and SSM state in
        the request's Mamba slot."""
        n = x.shape[0]
        # (conv_dim, kernel - 1), (heads, head_dim, d_state) fp32
        conv_state, ssm_state = cache.mamba_states(req, self.layer_id)

        zxbcdt = self.in_proj(x)  # (n, d_inner + conv_dim + heads)
        z, xbc, dt = zxbcdt.split([self.d_inner, self.conv_dim, self.num_heads], dim=-1)
        xbc, new_conv_state = self.kernel.conv(xbc, conv_state, self.conv_weight, self.conv_bias)  # (n, conv_dim)
        conv_state.copy_(new_conv_state)
        group_size = self.num_groups * self.d_state
        xs, b, c = xbc.split([self.d_inner, group_size, group_size], dim=-1)
        xs = xs.view(n, self.num_heads, self.head_dim)  # (n, heads, head_dim)
        b = b.view(n, self.num_groups, self.d_state)  # (n, groups, d_state)
        c = c.view(n, self.num_groups, self.d_state)  # (n, groups, d_state)
        dt = F.softplus(dt.float() + self.dt_bias)  # (n, heads)
        a = -torch.exp(self.a_log)  # (heads,)

        y, final_state = self.kernel.scan(xs, dt, a, b, c, self.block_len, ssm_state)
        ssm_state.copy_(final_state)
        y = y + self.d_skip[:, None] * xs.float()  # (n, heads, head_dim)

        # Gated RMSNorm (Mamba2 order: gate first, then normalise per group of d_inner / groups channels).
        y = y.reshape(n, self.d_inner) * F.silu(z.float())  # (n, d_inner)
        if self.norm_spans_ranks:
            y = y * torch.rsqrt(self._group_mean_square(y) + self.eps)
        else:
            y = y.view(n, self.num_groups, -1)
            y = y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        y = y.reshape(n, self.d_inner).to(x.dtype) * self.norm_weight
        return self.tp.all_reduce(self.out_proj(y))  # (n, hidden), summed over TP ranks

    def _group_mean_square(self, y: torch.Tensor) -> torch.Tensor:
        """Where this rank's channels are part of one norm group that spans TP ranks: the mean square over the whole
        group. y: (n, d_inner) fp32 -> (n, 1). Each rank puts its sum of squares in its group's column, the
        all-reduce adds the ranks of each group (one small all-reduce, as vLLM's Mixer2RMSNormGated does for one
        group)."""
        sums = y.new_zeros((y.shape[0], self.num_norm_groups))  # (n, groups of the layer)
        sums[:, self.group_idx] = y.pow(2).sum(dim=-1)
        sums = self.tp.all_reduce(sums)
        return (sums[:, self.group_idx] / self.norm_group_size)[:, None]
