"""The synthetic model, torch only (never torch.distributed): attention over the paged KV pool, MLA over the latent
pool, Mamba2 with chunked SSD, Gated DeltaNet with the chunked delta rule, MLP / MoE, and the pipeline stage that
stacks them."""

from ppprof.model.attention import Attention
from ppprof.model.attention_kernels import ATTENTION_BACKENDS, reference_attention, sdpa_attention
from ppprof.model.deltanet import GatedDeltaNet, chunk_gated_delta_rule, recurrent_gated_delta_rule
from ppprof.model.mamba import Mamba2, ssd_chunked
from ppprof.model.mla import MLAttention, mla_absorbed, mla_decompressed
from ppprof.model.mlp import MLP, MoE
from ppprof.model.stage import Stage, build_stage_cache
from ppprof.specs.partition import split_layers

__all__ = [
    "ATTENTION_BACKENDS",
    "MLP",
    "Attention",
    "GatedDeltaNet",
    "MLAttention",
    "Mamba2",
    "MoE",
    "Stage",
    "build_stage_cache",
    "chunk_gated_delta_rule",
    "mla_absorbed",
    "mla_decompressed",
    "recurrent_gated_delta_rule",
    "reference_attention",
    "sdpa_attention",
    "split_layers",
    "ssd_chunked",
]
