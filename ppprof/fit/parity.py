"""SGLang's own fit of the same samples, and nothing else (`ppprof fit --latency-model quadratic --parity sglang`):
the prefix-free rows in file order, the first one dropped (SGLang's profile has no warm-up), least squares on
[l^2, l, 1] with numpy's lstsq, a <= 0 turns dynamic chunking off, a negative b is set to 0; no outlier trimming and no
other gate. The coefficients are then those SGLang's start-up fit computes from the same rows."""

from __future__ import annotations

import numpy as np

from ppprof.fit.samples import Samples
from ppprof.policy.rule import LatencyModel
from ppprof.policy.servers import boot_model

SGLANG_MIN_POINTS = 8
PARITY_RULE = ("prefix-free rows in file order, the first dropped; numpy lstsq on [l^2, l, 1]; a <= 0: static; "
               "b < 0: b = 0; no trimming, no other gate")


def prefix_free_quadratic(samples: Samples) -> tuple[np.ndarray, np.ndarray, LatencyModel | None]:
    """The boot fit SGLang and vllm-ascend share: (the row dropped, the rows used, the quadratic least squares on
    [l^2, l, 1] of the prefix-free rows in file order less the first, unclamped; None under SGLANG_MIN_POINTS)."""
    rows = np.flatnonzero(samples.prefix_len == 0)
    used = rows[1:]
    if len(used) < SGLANG_MIN_POINTS:
        return rows[:1], used, None
    length = samples.chunk_size[used].astype(np.float64)
    design = np.column_stack([length * length, length, np.ones_like(length)])
    (a, b, c), *_ = np.linalg.lstsq(design, samples.latency_ms[used], rcond=None)
    return rows[:1], used, LatencyModel("quadratic", a=float(a), b=float(b), c=float(c))


def sglang_fit(samples: Samples) -> tuple[LatencyModel | None, str, dict]:
    """(model or None, reason, diagnostics) of SGLang's fit of `samples`."""
    dropped, used, raw = prefix_free_quadratic(samples)
    diag = {"parity": "sglang", "parity_rule": PARITY_RULE, "dropped_rows": [int(r) + 1 for r in dropped],
            "fit_rows": int(len(used))}
    if raw is None:
        return None, (f"SGLang needs >= {SGLANG_MIN_POINTS} prefix-free samples after dropping the first, has "
                      f"{len(used)}: dynamic chunking stays off"), diag
    if raw.a <= 0:
        return None, f"quadratic coefficient a = {raw.a:.4g} <= 0: SGLang turns dynamic chunking off", diag
    return boot_model("sglang", raw), "SGLang parity fit", diag


def boot_fits(samples: Samples) -> dict[str, LatencyModel | None]:
    """The model SGLang and vllm-ascend would fit at boot to these prefix-free forwards, with each server's clamps
    (ppprof.policy.servers.boot_model; None: it keeps fixed chunks)."""
    raw = prefix_free_quadratic(samples)[2]
    return {server: None if raw is None else boot_model(server, raw) for server in ("sglang", "vllm-ascend")}
