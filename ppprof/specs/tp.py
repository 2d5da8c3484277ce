"""Tensor parallelism inside a stage, as shapes: which part of every sharded dimension one TP rank holds (as SGLang and
vLLM shard them), and the check that a model can be split over `tp_size` ranks at all. Pure: no torch.

- Attention: query heads split evenly; KV heads split evenly where there are at least as many as TP ranks, else
  replicated: each rank holds one KV head, rank r the head r // (tp_size / num_key_value_heads).
- MLP: the intermediate dimension split (gate/up column-parallel, down row-parallel).
- MoE: experts sharded by TP, not expert parallel: every rank holds every expert's slice of the expert intermediate
  dimension, and the router whole; the experts' count needs no divisibility. A shared expert is a TP MLP.
- MLA, as SGLang and vLLM shard it without data-parallel attention: the query heads split (q_b_proj or q_proj and
  kv_b_proj column-parallel by head, o_proj row-parallel), q_a_proj and kv_a_proj whole, so the latent cache
  (kv_lora_rank + qk_rope_head_dim a token) is whole on every TP rank.
- Gated DeltaNet: key and value heads split evenly (in_proj_qkvz, in_proj_ba and the conv column-parallel by head,
  out_proj row-parallel); each rank's conv and recurrent states are those of its heads.
- Mamba2: heads split evenly; groups (B, C) split where there are at least as many as TP ranks, else replicated, rank r
  holding group r // (tp_size / mamba_n_groups) (SGLang's and vLLM's MambaMixer2).
- Embedding and LM head: vocab-parallel, ceil(vocab_size / tp_size) rows a rank, the last rank's padded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ppprof.bounds import (
    MAX_TP_SIZE as MAX_TP_SIZE,  # the bound lives on the ground floor, where the policy reads it too
)
from ppprof.specs.spec import MLP, MOE, ModelSpec


@dataclass(frozen=True, slots=True)
class Shard:
    """Rows [start, start + size) of a dimension of full length `full`; a replicated shard covers the same rows on
    several ranks."""

    start: int
    size: int
    full: int

    @property
    def stop(self) -> int:
        return self.start + self.size


def even_shard(full: int, tp_size: int, tp_rank: int) -> Shard:
    """The rank's equal share of `full` (a multiple of tp_size)."""
    size = full // tp_size
    return Shard(tp_rank * size, size, full)


def split_or_replicate(count: int, tp_size: int, tp_rank: int) -> Shard:
    """Heads (or groups) split evenly when count >= tp_size, else one a rank, replicated tp_size / count times."""
    if count >= tp_size:
        return even_shard(count, tp_size, tp_rank)
    return Shard(tp_rank // (tp_size // count), 1, count)


@dataclass(frozen=True, slots=True)
class RankShapes:
    """What one TP rank of a stage holds of each sharded dimension (counts in heads, groups or channels)."""

    tp_size: int
    tp_rank: int
    q_heads: Shard
    kv_heads: Shard
    intermediate: Shard
    moe_intermediate: Shard
    mamba_heads: Shard
    mamba_groups: Shard
    deltanet_key_heads: Shard
    deltanet_value_heads: Shard
    vocab: Shard

    @property
    def kv_head_replicas(self) -> int:
        """How many TP ranks hold the same KV head (1 where the KV heads are split)."""
        return max(1, self.tp_size // max(1, self.kv_heads.full))


def rank_shapes(spec: ModelSpec, tp_size: int = 1, tp_rank: int = 0) -> RankShapes:
    """The per-rank shards of `spec` at TP rank `tp_rank` of `tp_size` (check_tp first: this assumes it passed)."""

    def shard(count: int, replicate: bool = False) -> Shard:
        if count == 0:
            return Shard(0, 0, 0)
        return split_or_replicate(count, tp_size, tp_rank) if replicate else even_shard(count, tp_size, tp_rank)

    vocab_rows = -(-spec.vocab_size // tp_size)
    vocab = Shard(tp_rank * vocab_rows, vocab_rows, spec.vocab_size)
    return RankShapes(
        tp_size=tp_size,
        tp_rank=tp_rank,
        q_heads=shard(spec.num_attention_heads),
        kv_heads=shard(spec.num_key_value_heads, replicate=True),
        intermediate=shard(spec.intermediate_size),
        moe_intermediate=shard(spec.moe_intermediate_size),
        mamba_heads=shard(spec.mamba_num_heads),
        mamba_groups=shard(spec.mamba_n_groups, replicate=True),
        deltanet_key_heads=shard(spec.linear_num_key_heads),
        deltanet_value_heads=shard(spec.linear_num_value_heads),
        vocab=vocab,
    )


def rank_spec(spec: ModelSpec, tp_size: int, tp_rank: int = 0) -> ModelSpec:
    """The model as one TP rank holds it: its heads (attention, MLA, Mamba2, Gated DeltaNet), KV heads, groups,
    intermediate and vocab rows, the rest (hidden, norms, the router, MLA's latent) whole; what per-stage accounting and memory estimates of `spec` give per TP rank. `spec`
    itself at TP = 1."""
    if tp_size == 1:
        return spec
    s = rank_shapes(spec, tp_size, tp_rank)
    return dataclasses.replace(
        spec,
        num_attention_heads=s.q_heads.size,
        num_key_value_heads=s.kv_heads.size,
        intermediate_size=s.intermediate.size,
        moe_intermediate_size=s.moe_intermediate.size,
        shared_expert_intermediate_size=spec.shared_expert_intermediate_size // tp_size,
        mamba_num_heads=s.mamba_heads.size,
        mamba_n_groups=s.mamba_groups.size,
        linear_num_key_heads=s.deltanet_key_heads.size,
        linear_num_value_heads=s.deltanet_value_heads.size,
        vocab_size=s.vocab.size,
    )


def tp_problem(spec: ModelSpec, tp_size: int) -> str | None:
    """Why `spec` cannot be split over `tp_size` TP ranks (the field, its value, the fix), or None."""
    layers = spec.layers
    checks = []
    if any(layer.has_attention or layer.has_mla for layer in layers):
        checks.append(("num_attention_heads", spec.num_attention_heads, False))
    if any(layer.has_attention for layer in layers):
        checks.append(("num_key_value_heads", spec.num_key_value_heads, True))
    if any(layer.has_deltanet for layer in layers):
        # its value heads are a multiple of its key heads (ModelSpec checks it): they split where these do
        checks.append(("linear_num_key_heads", spec.linear_num_key_heads, False))
    if any(layer.ffn == MLP for layer in layers):
        checks.append(("intermediate_size", spec.intermediate_size, False))
    if any(layer.ffn == MOE for layer in layers):
        checks.append(("moe_intermediate_size", spec.moe_intermediate_size, False))
        if spec.shared_expert_intermediate_size:
            checks.append(("shared_expert_intermediate_size", spec.shared_expert_intermediate_size, False))
    if any(layer.has_mamba for layer in layers):
        checks.append(("mamba_num_heads", spec.mamba_num_heads, False))
        checks.append(("mamba_n_groups", spec.mamba_n_groups, True))
    for name, value, may_replicate in checks:
        if value % tp_size == 0:
            continue
        if may_replicate and value < tp_size and tp_size % value == 0:
            continue  # replicated: each rank holds one
        how = f"a divisor of {value}" + (" or a multiple of it" if may_replicate else "")
        return (
            f"--tp-size {tp_size} does not divide {name} ({value}) of model {spec.name!r}: use a --tp-size that "
            f"is {how}"
        )
    return None


def check_tp(spec: ModelSpec, tp_size: int) -> None:
    """ValueError (one line) where `spec` cannot be split over `tp_size` ranks."""
    if not 1 <= tp_size <= MAX_TP_SIZE:
        raise ValueError(f"--tp-size {tp_size} must be in 1..{MAX_TP_SIZE}")
    problem = tp_problem(spec, tp_size)
    if problem:
        raise ValueError(problem)
