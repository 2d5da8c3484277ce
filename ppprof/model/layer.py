"""One layer of the synthetic model (pre-norm, mixers, FFN) run over a packed forward of one or more requests'
chunks (`Piece`s), and the RMSNorm fused with the residual add."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ppprof.mem.cache import Request, StageCache
from ppprof.model.attention import Attention
from ppprof.model.attention_kernels import AttentionKernel
from ppprof.model.deltanet import DeltaNetKernel, GatedDeltaNet
from ppprof.model.mamba import Mamba2, MambaKernel
from ppprof.model.mla import MLAForm, MLAttention
from ppprof.model.mlp import MLP, MoE
from ppprof.model.tp import NO_TP, TPComm, assign, full_shape
from ppprof.specs.spec import MOE, ModelSpec


class RMSNorm(nn.Module):
    """RMSNorm fused with the residual add, as serving engines run it."""

    def __init__(self, hidden_size: int, eps: float, *, dtype: torch.dtype, device: str | torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x, residual: (n, hidden). residual <- x + residual (x alone when None); returns (norm(residual), residual)."""
        residual = x if residual is None else x + residual
        h = residual.float()
        h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return h.to(x.dtype) * self.weight, residual


@dataclass(frozen=True, slots=True)
class Kernels:
    """The kernels a stage's layers run, chosen once for the stage (Stage): attention's, Mamba2's, the Gated
    DeltaNet's."""

    attention: AttentionKernel
    mamba: MambaKernel
    deltanet: DeltaNetKernel | None = None


class Layer(nn.Module):
    """norm -> mixers in parallel, summed (if any) -> norm -> FFN (if any); each norm adds the pending output into the
    residual stream first."""

    def __init__(
        self,
        spec: ModelSpec,
        layer_id: int,
        *,
        dtype: torch.dtype,
        device: str | torch.device,
        kernels: Kernels,
        tp: TPComm = NO_TP,
    ) -> None:
        super().__init__()
        layer = spec.layers[layer_id]
        attention_kernel, mamba_kernel, deltanet_kernel = kernels.attention, kernels.mamba, kernels.deltanet
        kw = dict(dtype=dtype, device=device)
        self.layer_id = layer_id
        self.mixer_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **kw) if layer.mixers else None
        if layer.has_mla:  # MLA takes the attention slot: a model has one KV mixer kind (ModelSpec checks it)
            form = MLAForm(reference=attention_kernel.backend == "reference")
            self.attention = MLAttention(spec, layer_id, form=form, tp=tp, **kw)
        else:
            self.attention = (
                Attention(spec, layer_id, kernel=attention_kernel, tp=tp, **kw) if layer.has_attention else None
            )
        if layer.has_deltanet:  # likewise the Gated DeltaNet takes the Mamba slot
            self.mamba = GatedDeltaNet(spec, layer_id, kernel=deltanet_kernel, tp=tp, **kw)
        else:
            self.mamba = Mamba2(spec, layer_id, kernel=mamba_kernel, tp=tp, **kw) if layer.has_mamba else None
        self.ffn_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **kw) if layer.ffn else None
        if layer.ffn == MOE:
            self.ffn = MoE(spec, tp=tp, **kw)
        elif layer.ffn:
            self.ffn = MLP(spec.hidden_size, spec.intermediate_size, act=spec.mlp_act, tp=tp, **kw)
        else:
            self.ffn = None

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator, std: float) -> None:
        """Norm weights 1, Mamba's (or the Gated DeltaNet's) own init, every other weight N(0, std^2), drawn in
        registration order at its full (TP = 1) shape, this rank keeping its shard (ppprof.model.tp)."""
        if self.mamba is not None:
            self.mamba.init_weights(generator, std)
        mamba_params = set(self.mamba.parameters()) if self.mamba is not None else set()
        # The layer's norms, and those inside its mixer (MLA's q_a and kv_a norms, attention's q/k norms).
        norm_params = {
            p
            for name, p in self.named_parameters()
            if "norm" in name.rsplit(".", 1)[-1] or name.endswith("norm.weight")
        }
        for p in self.parameters():
            if p in mamba_params:
                continue
            if p in norm_params:
                p.fill_(1.0)
            else:
                assign(p, torch.randn(full_shape(p), generator=generator) * std)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, cache: StageCache, pieces: Sequence[Piece]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (N, hidden) pending output of the previous layer for the packed `pieces` (their tokens one after the
        other, N in all); residual: (N, hidden) or None before the first layer. Returns this layer's pending output
        and the residual stream, both (N, hidden). The norms and the FFN run once over the N tokens; each mixer
        runs each piece at its own prefix, on its own KV slots and Mamba slot."""
        if self.mixer_norm is not None:
            h, residual = self.mixer_norm(x, residual)
            if len(pieces) == 1:  # one request's chunk: no copy
                x = self._mixers(h, cache, pieces[0])
            else:
                x = torch.cat([self._mixers(part, cache, p) for part, p in zip(split_pieces(h, pieces), pieces)])
        if self.ffn is not None:
            h, residual = self.ffn_norm(x, residual)
            x = self.ffn(h)
        return x, residual

    def _mixers(self, h: torch.Tensor, cache: StageCache, piece: Piece) -> torch.Tensor:
        x = None
        if self.attention is not None:
            x = self.attention(h, cache, piece.req, piece.prefix_len)
        if self.mamba is not None:
            out = self.mamba(h, cache, piece.req)
            x = out if x is None else x + out
        return x


@dataclass(frozen=True, slots=True)
class Piece:
    """One request's chunk in a packed forward (a batch's piece, ppprof.serving.scheduler.Piece, as a stage holds
    it): `size` new tokens of `req` after its `prefix_len` cached ones."""

    req: Request
    prefix_len: int
    size: int


def split_pieces(x: torch.Tensor, pieces: Sequence[Piece]) -> tuple[torch.Tensor, ...]:
    """x: (N, ...) packed rows -> each piece's rows (a view each)."""
    return x.split([s.size for s in pieces])
