"""The one device-aware timer: synchronize the device around each measurement so that queued kernels count."""

from __future__ import annotations

import time

import torch


def device_sync(device: torch.device) -> None:
    """Wait for the compute stream only: a device-wide sync would also wait for NCCL transfers in flight (a bench's
    receive of the next chunk), which would serialise the pipeline."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class Timer:
    """`with Timer(device) as t: ...` then `t.elapsed_ms`."""

    __slots__ = ("device", "start", "elapsed_ms")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.elapsed_ms = float("nan")

    def __enter__(self) -> Timer:
        device_sync(self.device)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        device_sync(self.device)
        self.elapsed_ms = (time.perf_counter() - self.start) * 1e3
