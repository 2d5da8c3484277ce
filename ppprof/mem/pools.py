"""Pools that own the cache tensors of one pipeline stage, indexed by slot. Only the stage's own layers get buffers."""

from __future__ import annotations

from dataclasses import dataclass

import torch


class KVPool:
    """K and V buffers per attention layer: (total_slots, num_kv_heads, head_dim) each."""

    def __init__(
        self,
        total_slots: int,
        layer_ids: list[int],
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
    ) -> None:
        self.total_slots = total_slots
        self.layer_ids = list(layer_ids)
        shape = (total_slots, num_kv_heads, head_dim)
        self.k = {i: torch.zeros(shape, dtype=dtype, device=device) for i in self.layer_ids}
        self.v = {i: torch.zeros(shape, dtype=dtype, device=device) for i in self.layer_ids}
        self._noise: torch.Tensor | None = None

    def write(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots: (n,); k, v: (n, num_kv_heads, head_dim)."""
        self.k[layer_id][slots] = k
        self.v[layer_id][slots] = v

    def fill_random(self, slots: torch.Tensor, generator: torch.Generator | None = None) -> None:
        """Write random K/V at `slots` in every layer (a probe's synthetic prefix, not computed).

        The values do not change what a forward costs, so one random block, drawn on the host once and kept on the
        device, is copied into every layer: a fill costs a device copy, not a host draw per layer and request."""
        n = slots.numel()
        if self._noise is None or self._noise.shape[0] < n:
            any_buf = self.k[self.layer_ids[0]]
            shape = (max(n, 2 * (0 if self._noise is None else self._noise.shape[0])), *any_buf.shape[1:])
            self._noise = torch.randn(shape, generator=generator, dtype=torch.float32).to(any_buf)
        noise = self._noise[:n]  # (n, num_kv_heads, head_dim)
        for i in self.layer_ids:
            self.k[i].index_copy_(0, slots, noise)
            self.v[i].index_copy_(0, slots, noise)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in (self.k, self.v) for t in d.values())


class LatentPool:
    """MLA's KV pool: one buffer per MLA layer, (total_slots, latent_dim), each token's normed latent (kv_lora_rank)
    and its RoPE'd key shared by the heads (qk_rope_head_dim), as servers keep MLA's cache. Same calls as KVPool."""

    def __init__(
        self, total_slots: int, layer_ids: list[int], latent_dim: int, dtype: torch.dtype, device: str | torch.device
    ) -> None:
        self.total_slots = total_slots
        self.layer_ids = list(layer_ids)
        self.latent = {i: torch.zeros((total_slots, latent_dim), dtype=dtype, device=device) for i in self.layer_ids}
        self._noise: torch.Tensor | None = None

    def write(self, layer_id: int, slots: torch.Tensor, latent: torch.Tensor) -> None:
        """slots: (n,); latent: (n, latent_dim)."""
        self.latent[layer_id][slots] = latent

    def fill_random(self, slots: torch.Tensor, generator: torch.Generator | None = None) -> None:
        """Random latents at `slots` in every layer (a probe's synthetic prefix): one block, drawn once, as KVPool."""
        n = slots.numel()
        if self._noise is None or self._noise.shape[0] < n:
            any_buf = self.latent[self.layer_ids[0]]
            rows = max(n, 2 * (0 if self._noise is None else self._noise.shape[0]))
            self._noise = torch.randn((rows, any_buf.shape[1]), generator=generator, dtype=torch.float32).to(any_buf)
        for i in self.layer_ids:
            self.latent[i].index_copy_(0, slots, self._noise[:n])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.latent.values())


@dataclass(frozen=True, slots=True)
class StateShape:
    """The shape of one slot's state in one layer (MambaPool): its conv state and its SSM (or DeltaNet recurrent)
    state."""

    conv_dim: int
    conv_kernel: int
    """Conv channels, and the conv's kernel width (the state keeps conv_kernel - 1 positions)."""
    num_heads: int
    head_dim: int
    state_size: int
    """The SSM state's (heads, head dim, d_state); a Gated DeltaNet's (value heads, key head dim, value head dim)."""


class MambaPool:
    """Conv state (total_slots, conv_dim, conv_kernel - 1) and SSM state (total_slots, num_heads, head_dim, d_state)
    per Mamba layer (`shape`). A Gated DeltaNet layer keeps its slot here too (as SGLang does): its conv state, and
    its recurrent state (value heads, key head dim, value head dim) in the SSM buffer."""

    def __init__(
        self,
        total_slots: int,
        layer_ids: list[int],
        shape: StateShape,
        dtype: torch.dtype,
        device: str | torch.device,
        ssm_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.total_slots = total_slots
        self.layer_ids = list(layer_ids)
        conv_shape = (total_slots, shape.conv_dim, shape.conv_kernel - 1)
        self.conv = {i: torch.zeros(conv_shape, dtype=dtype, device=device) for i in self.layer_ids}
        # The SSM state is kept in fp32, as serving engines do, since it accumulates over the whole prompt.
        ssm_shape = (total_slots, shape.num_heads, shape.head_dim, shape.state_size)
        self.ssm = {i: torch.zeros(ssm_shape, dtype=ssm_dtype, device=device) for i in self.layer_ids}
        self._noise: tuple[torch.Tensor, torch.Tensor] | None = None

    def reset(self, slot: int) -> None:
        """Zero the state of `slot`: a new request starts from an empty state."""
        for i in self.layer_ids:
            self.conv[i][slot].zero_()
            self.ssm[i][slot].zero_()

    def fill_random(self, slot: int, generator: torch.Generator | None = None) -> None:
        """Random state at `slot` (a probe's synthetic prefix); one random state, drawn once, serves every layer."""
        if self._noise is None:
            first = self.layer_ids[0]
            self._noise = tuple(
                torch.randn(buf.shape[1:], generator=generator, dtype=torch.float32).to(buf) * 0.1
                for buf in (self.conv[first], self.ssm[first])
            )
        conv_noise, ssm_noise = self._noise
        for i in self.layer_ids:
            self.conv[i][slot] = conv_noise
            self.ssm[i][slot] = ssm_noise

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in (self.conv, self.ssm) for t in d.values())
