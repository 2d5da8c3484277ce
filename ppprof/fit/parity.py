"""SGLang's own fit of the same samples, and nothing else (`ppprof fit --latency-model quadratic --parity sglang`):
SGLang's boot fit (ppprof.servers.sglang: the prefix-free rows in file order, the first one dropped, least squares on
[l^2, l, 1] with numpy's lstsq, a <= 0 turns dynamic chunking off, a negative b is set to 0); no outlier trimming and
no other gate. The coefficients are then those SGLang's start-up fit computes from the same rows."""

from __future__ import annotations

from ppprof.fit.samples import Samples
from ppprof.policy.rule import LatencyModel
from ppprof.servers.boot import MIN_POINTS, prefix_free_quadratic
from ppprof.servers.sglang import PARITY, SGLANG

PARITY_RULE = (
    "prefix-free rows in file order, the first dropped; numpy lstsq on [l^2, l, 1]; a <= 0: static; "
    "b < 0: b = 0; no trimming, no other gate"
)


def sglang_fit(samples: Samples) -> tuple[LatencyModel | None, str, dict]:
    """(model or None, reason, diagnostics) of SGLang's fit of `samples`."""
    found = prefix_free_quadratic(samples)
    diag = {
        "parity": PARITY,
        "parity_rule": PARITY_RULE,
        "dropped_rows": [int(r) + 1 for r in found.dropped],
        "fit_rows": int(len(found.used)),
    }
    if found.model is None:
        return (
            None,
            (
                f"SGLang needs >= {MIN_POINTS} prefix-free samples after dropping the first, has "
                f"{len(found.used)}: dynamic chunking stays off"
            ),
            diag,
        )
    if found.model.a <= 0:
        return None, f"quadratic coefficient a = {found.model.a:.4g} <= 0: SGLang turns dynamic chunking off", diag
    return SGLANG.boot_fit(samples), "SGLang parity fit", diag
