"""One pipeline stage of the synthetic model: its layers (pre-norm, residual stream carried between stages), the
embedding on the first stage, final norm and LM head on the last; and the StageCache sized for its own layers."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch
from torch import nn

from ppprof.mem.cache import Request, StageCache
from ppprof.mem.kv import KVAllocator
from ppprof.mem.mamba_slots import MambaAllocator
from ppprof.mem.pools import KVPool, LatentPool, MambaPool, StateShape
from ppprof.mem.req import ReqToTokenPool
from ppprof.model.attention_kernels import AttentionKernel
from ppprof.model.deltanet import DeltaNetKernel
from ppprof.model.layer import Kernels, Layer, Piece, RMSNorm
from ppprof.model.mamba import MambaKernel
from ppprof.model.tp import NO_TP, TPComm, assign, full_shape, mark_sharded, take_padded_rows, vocab_embed
from ppprof.specs.accounting import deltanet_state_shapes
from ppprof.specs.memory import CacheSizes
from ppprof.specs.spec import ModelSpec
from ppprof.specs.tp import rank_shapes, rank_spec

INIT_STD = 0.02
"""Std of the random projection weights: small enough that activations stay finite through many layers."""


def _check_layer_ids(spec: ModelSpec, layer_ids: range) -> None:
    if len(layer_ids) == 0 or layer_ids.step != 1 or layer_ids.start < 0 or layer_ids.stop > spec.num_layers:
        raise ValueError(
            f"layer_ids {layer_ids} must be a non-empty contiguous range inside [0, {spec.num_layers}): "
            "use a range from ppprof.specs.partition.split_layers"
        )


class Stage(nn.Module):
    """The layers `layer_ids` of `spec`, plus the embedding if it holds layer 0 and final norm + LM head if it holds
    the last layer. Weights are random but a function of (seed, layer id) only: layer i draws from a generator seeded
    with seed + i, the embedding from seed + num_layers, the LM head from seed + num_layers + 1, so stages built
    separately on different ranks together equal the unsplit model. `attention_backend` is one of
    ppprof.model.attention_kernels.ATTENTION_BACKENDS.

    Under TP (`tp`, the stage's TP group), this rank's shard of every layer (ppprof.specs.tp), drawn from the same
    generators as TP = 1, so that the TP ranks together compute the TP = 1 stage; the embedding and the LM head
    vocab-parallel (the logits gathered). On the meta device the stage has its shapes and no values (no weights
    drawn), for a dry run at full size."""

    def __init__(
        self,
        spec: ModelSpec,
        layer_ids: range,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        seed: int = 0,
        attention_backend: str = "sdpa",
        tp: TPComm = NO_TP,
    ) -> None:
        super().__init__()
        _check_layer_ids(spec, layer_ids)
        self.attention_kernel = AttentionKernel(attention_backend, torch.device(device))
        self.mamba_kernel = MambaKernel(torch.device(device))
        self.deltanet_kernel = DeltaNetKernel(torch.device(device))
        self.spec = spec
        self.layer_ids = layer_ids
        self.is_first = layer_ids.start == 0
        self.is_last = layer_ids.stop == spec.num_layers
        self.tp = tp
        self.vocab = rank_shapes(spec, tp.size, tp.rank).vocab
        kw = dict(dtype=dtype, device=device)
        kernels = Kernels(self.attention_kernel, self.mamba_kernel, self.deltanet_kernel)
        self.embed = nn.Embedding(self.vocab.size, spec.hidden_size, **kw) if self.is_first else None
        # Keyed by global layer id, so a stage's state_dict names match the unsplit model's.
        self.layers = nn.ModuleDict({str(i): Layer(spec, i, kernels=kernels, tp=tp, **kw) for i in layer_ids})
        self.final_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **kw) if self.is_last else None
        self.lm_head = nn.Linear(spec.hidden_size, self.vocab.size, bias=False, **kw) if self.is_last else None
        if tp.size > 1:
            for module in (self.embed, self.lm_head):
                if module is not None:
                    mark_sharded(
                        module.weight,
                        (spec.vocab_size, spec.hidden_size),
                        lambda full: take_padded_rows(full, self.vocab),
                    )
        if torch.device(device).type != "meta":  # meta tensors hold shapes only: nothing to draw (a dry run)
            self._init_weights(seed)

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        for i in self.layer_ids:
            self.layers[str(i)].init_weights(torch.Generator().manual_seed(seed + i), INIT_STD)
        for module, offset in ((self.embed, 0), (self.lm_head, 1)):
            if module is not None:
                gen = torch.Generator().manual_seed(seed + self.spec.num_layers + offset)
                assign(module.weight, torch.randn(full_shape(module.weight), generator=gen) * INIT_STD)

    def forward(
        self, cache: StageCache, req: Request, x: torch.Tensor, residual: torch.Tensor | None, prefix_len: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run one chunk of one request: its n new tokens at positions [prefix_len, prefix_len + n).

        x: (n,) int64 token ids on the first stage, else (n, hidden) pending output from the previous stage;
        residual: None on the first stage, else (n, hidden) residual stream from the previous stage.
        The caller has admitted `req` (cache.admit) and extended it by n (cache.extend), so the chunk's KV slots are in
        its table and its Mamba slot exists.
        Returns (hidden, residual), both (n, hidden), to send to the next stage; on the last stage
        (logits, None) with logits: (vocab,), those of the chunk's last token.
        """
        x, residual = self.forward_packed(cache, [Piece(req, prefix_len, x.shape[0])], x, residual)
        return (x[0], None) if self.is_last else (x, residual)

    @torch.inference_mode()
    def forward_packed(
        self, cache: StageCache, pieces: Sequence[Piece], x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward of several requests' chunks packed one after the other, each at its own prefix, as servers'
        variable-length batches run: x and residual hold the pieces' N tokens in order (as forward's for one
        chunk). Each piece's request is admitted and extended by its size. Returns (hidden, residual), both
        (N, hidden); on the last stage (logits, None) with logits: (pieces, vocab), each piece's last token's."""
        if self.is_first:
            if x.dtype != torch.int64 or x.dim() != 1 or residual is not None:
                raise ValueError(
                    f"the first stage takes token ids (n,) int64 and no residual; got {tuple(x.shape)} "
                    f"{x.dtype}, residual={'set' if residual is not None else None}"
                )
            x = vocab_embed(self.embed.weight, x, self.vocab, self.tp)  # (N, hidden)
        elif x.dim() != 2 or residual is None:
            raise ValueError(
                f"stage {self.layer_ids} takes hidden states (n, hidden) and a residual; "
                f"got {tuple(x.shape)}, residual={'set' if residual is not None else None}"
            )
        if sum(s.size for s in pieces) != x.shape[0] or any(s.size < 1 for s in pieces):
            raise ValueError(f"the pieces' sizes {[s.size for s in pieces]} do not cover the {x.shape[0]} tokens given")
        for s in pieces:
            if s.req.kv_len < s.prefix_len + s.size:
                raise ValueError(
                    f"request {s.req.rid} has KV slots for {s.req.kv_len} positions but the chunk ends at "
                    f"{s.prefix_len + s.size}: call cache.extend(req, n) first"
                )
        for layer in self.layers.values():
            x, residual = layer(x, residual, cache, pieces)  # (N, hidden) each
        if not self.is_last:
            return x, residual
        if len(pieces) == 1:
            x, residual = x[-1:], residual[-1:]
        else:
            ends = torch.tensor(list(accumulate(s.size for s in pieces)), device=x.device) - 1
            x, residual = x[ends], residual[ends]
        h, _ = self.final_norm(x, residual)  # (pieces, hidden): each one's last token
        logits = self.lm_head(h)  # (pieces, vocab), or this rank's vocab rows under TP
        if self.tp.size > 1:  # gathered along the vocabulary, the padding dropped
            logits = self.tp.all_gather(logits.T.contiguous()).T[:, : self.spec.vocab_size]  # (pieces, vocab)
        return logits, None


def build_stage_cache(
    spec: ModelSpec,
    layer_ids: range,
    sizes: CacheSizes,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    tp_size: int = 1,
    tp_rank: int = 0,
) -> StageCache:
    """StageCache of `sizes` with pools for the stage's own layers only: the KV pool of its attention layers (or the latent pool
    of its MLA layers), the Mamba pool of its Mamba2 (or Gated DeltaNet) layers; under TP, those of TP rank
    `tp_rank`: KV for its KV heads (MLA's latent whole), Mamba state for its Mamba2 heads and groups or its Gated
    DeltaNet heads (the allocators the same on every rank).

    The KV allocator always exists (request bookkeeping runs the same on every stage) even with no attention layer;
    a stage with no Mamba or Gated DeltaNet layer gets neither a Mamba allocator nor a Mamba pool.
    """
    _check_layer_ids(spec, layer_ids)
    kv_ids = [i for i in layer_ids if spec.layers[i].has_kv]
    state_ids = [i for i in layer_ids if spec.layers[i].has_state]
    shapes = rank_shapes(spec, tp_size, tp_rank)
    req_pool = ReqToTokenPool(sizes.max_running_requests, sizes.context_len, device)
    kv_alloc = KVAllocator(sizes.max_total_tokens, sizes.page_size)
    kv_pool = None
    if kv_ids and spec.layers[kv_ids[0]].has_mla:
        kv_pool = LatentPool(kv_alloc.total_slots, kv_ids, spec.mla_latent_dim, dtype, device)
    elif kv_ids:
        kv_pool = KVPool(kv_alloc.total_slots, kv_ids, shapes.kv_heads.size, spec.head_dim, dtype, device)
    mamba_alloc = mamba_pool = None
    if state_ids:
        mamba_alloc = MambaAllocator(sizes.max_mamba_cache_size)
        if spec.layers[state_ids[0]].has_deltanet:
            (conv_dim, conv_width), state_shape = deltanet_state_shapes(rank_spec(spec, tp_size, tp_rank))
            shape = StateShape(conv_dim, conv_width + 1, *state_shape)
        else:
            heads, groups = shapes.mamba_heads.size, shapes.mamba_groups.size
            conv_dim = heads * spec.mamba_head_dim + 2 * groups * spec.ssm_state_size
            shape = StateShape(conv_dim, spec.conv_kernel, heads, spec.mamba_head_dim, spec.ssm_state_size)
        mamba_pool = MambaPool(mamba_alloc.total_slots, state_ids, shape, dtype, device)
    return StageCache(
        req_pool=req_pool, kv_alloc=kv_alloc, mamba_alloc=mamba_alloc, kv_pool=kv_pool, mamba_pool=mamba_pool
    )
