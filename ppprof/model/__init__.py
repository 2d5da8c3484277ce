"""The synthetic model, torch only (never torch.distributed): attention over the paged KV pool, Mamba2 with chunked
SSD, MLP / MoE, and the pipeline stage that stacks them."""

from ppprof.model.attention import Attention
from ppprof.model.attention_kernels import ATTENTION_BACKENDS, reference_attention, sdpa_attention
from ppprof.model.mamba import Mamba2, ssd_chunked
from ppprof.model.mlp import MLP, MoE
from ppprof.model.stage import Stage, build_stage_cache
from ppprof.specs.partition import split_layers

__all__ = ["ATTENTION_BACKENDS", "MLP", "Attention", "Mamba2", "MoE", "Stage", "build_stage_cache",
           "reference_attention", "sdpa_attention", "split_layers", "ssd_chunked"]
