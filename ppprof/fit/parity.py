"""SGLang's own fit of the same samples, and nothing else (`ppprof fit --latency-model quadratic --parity sglang`):
the prefix-free rows in file order, the first one dropped (SGLang's profile has no warm-up), least squares on
[l^2, l, 1] with numpy's lstsq, a <= 0 turns dynamic chunking off, a negative b is set to 0; no outlier trimming and no
other gate. The coefficients are then those SGLang's start-up fit computes from the same rows."""

from __future__ import annotations

import numpy as np

from ppprof.fit.samples import Samples
from ppprof.policy.rule import LatencyModel

SGLANG_MIN_POINTS = 8
PARITY_RULE = ("prefix-free rows in file order, the first dropped; numpy lstsq on [l^2, l, 1]; a <= 0: static; "
               "b < 0: b = 0; no trimming, no other gate")


def sglang_fit(samples: Samples) -> tuple[LatencyModel | None, str, dict]:
    """(model or None, reason, diagnostics) of SGLang's fit of `samples`."""
    rows = np.flatnonzero(samples.prefix_len == 0)
    used = rows[1:]
    diag = {"parity": "sglang", "parity_rule": PARITY_RULE, "dropped_rows": [int(r) + 1 for r in rows[:1]],
            "fit_rows": int(len(used))}
    if len(used) < SGLANG_MIN_POINTS:
        return None, (f"SGLang needs >= {SGLANG_MIN_POINTS} prefix-free samples after dropping the first, has "
                      f"{len(used)}: dynamic chunking stays off"), diag
    length = samples.chunk_size[used].astype(np.float64)
    design = np.column_stack([length * length, length, np.ones_like(length)])
    (a, b, c), *_ = np.linalg.lstsq(design, samples.latency_ms[used], rcond=None)
    if a <= 0:
        return None, f"quadratic coefficient a = {a:.4g} <= 0: SGLang turns dynamic chunking off", diag
    return LatencyModel("quadratic", a=float(a), b=max(float(b), 0.0), c=float(c)), "SGLang parity fit", diag


def vllm_ascend_fit(samples: Samples) -> LatencyModel | None:
    """vllm-ascend's boot fit of the same rows: least squares on [l^2, l, 1] (at least 8 points), a negative a set to
    1e-9, b kept as fitted; None where it has too few points (it then keeps fixed chunks)."""
    rows = np.flatnonzero(samples.prefix_len == 0)[1:]
    if len(rows) < SGLANG_MIN_POINTS:
        return None
    length = samples.chunk_size[rows].astype(np.float64)
    design = np.column_stack([length * length, length, np.ones_like(length)])
    (a, b, c), *_ = np.linalg.lstsq(design, samples.latency_ms[rows], rcond=None)
    return LatencyModel("quadratic", a=float(a) if a >= 0 else 1e-9, b=float(b), c=float(c))


def boot_fits(samples: Samples) -> dict[str, LatencyModel | None]:
    """The model SGLang and vllm-ascend would fit at boot to these prefix-free forwards (None: fixed chunks)."""
    return {"sglang": sglang_fit(samples)[0], "vllm-ascend": vllm_ascend_fit(samples)}
