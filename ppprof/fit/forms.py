"""The latency model forms a fit may choose, what samples each needs, and their regressors (numpy only):

- quadratic (SGLang): f(l) = a l^2 + b l + c, fitted only on prefix-free rows (prefix_len == 0), where a request of l
  tokens really takes f(l) (SGLang profiles prefix-free requests only); >= 8 such rows; a <= 0 is a failure; a
  negative b is set to 0 (SGLang clamps it). Prefixed rows are not fitted, but they are scored.
- prefix (ATOM): t(L, x) = c + g L + b x + a (2 L x + x^2) on all rows; >= 2 distinct chunk sizes and >= 3 distinct
  prefixes. Coefficients must be non-negative: the most negative term (by its share of the mean latency) is dropped
  from the design and the rest refitted, until none is negative (a refit, not a clamp, so the others absorb its share).
- pairs: the prefix form plus h L x^2, a per-pair attention cost a + h x / 2 that changes with the chunk (cache and
  tile effects: on CPU a query-key pair costs less in a larger chunk, whose block of queries reuses each key, h < 0);
  exact bounded least squares (scipy's lsq_linear) with c, g, b, a >= 0 and h of either sign, so it never fits worse
  than the prefix model it contains (h = 0). A negative h is kept only while a + h x >= 0 up to PAIR_HEADROOM x the
  largest chunk fitted, where the latency then still grows with the chunk at every prefix; else h >= 0 (nnls).
Every prediction, for scoring and diagnostics alike, is the planner's: model.chunk_latency_ms(prefix_len, chunk_size)
(for the quadratic, c + f(L + x) - f(L), which is f(x) on a prefix-free row). The fits are in
ppprof.fit.least_squares, the model choice in ppprof.fit.crossval.
"""

from __future__ import annotations

import numpy as np

MIN_QUADRATIC_POINTS = 8
MIN_QUADRATIC_LENGTHS = 3
MIN_PREFIX_CHUNK_SIZES = 2
MIN_PREFIX_PREFIXES = 3
PREFIX_TERMS = ("c", "g", "b", "a")
MODEL_TERMS = {"prefix": PREFIX_TERMS, "pairs": PREFIX_TERMS + ("h",)}
ADMISSIBLE_ROWS = {
    "quadratic": "prefix-free rows (prefix_len == 0)",
    "prefix": "rows, prefix-free and prefixed",
    "pairs": "rows, prefix-free and prefixed",
}


class Unfittable(Exception):
    """The samples do not support the model (not bad input: the policy becomes static with this reason)."""


def admissible(name: str, prefix_len) -> np.ndarray:
    """Rows the model may be fitted to: the quadratic's f(l) is a request's latency only without a prefix."""
    prefix_len = np.asarray(prefix_len)
    return prefix_len == 0 if name == "quadratic" else np.ones(len(prefix_len), dtype=bool)


def ineligible(name: str, prefix_len: np.ndarray, chunk_size: np.ndarray) -> str | None:
    """Why `name` cannot be fitted to these samples, or None."""
    if name == "quadratic":
        free = admissible(name, prefix_len)
        num_free = int(free.sum())
        if num_free < MIN_QUADRATIC_POINTS:
            return (
                f"quadratic needs >= {MIN_QUADRATIC_POINTS} prefix-free samples (prefix_len == 0), has {num_free} "
                f"of {len(prefix_len)}: profile a prefix-free sweep or use the prefix model"
            )
        if len(np.unique(chunk_size[free])) < MIN_QUADRATIC_LENGTHS:
            return f"quadratic needs >= {MIN_QUADRATIC_LENGTHS} distinct lengths among its prefix-free samples"
        return None
    num_chunks, num_prefixes = len(np.unique(chunk_size)), len(np.unique(prefix_len))
    if num_chunks < MIN_PREFIX_CHUNK_SIZES or num_prefixes < MIN_PREFIX_PREFIXES:
        return (
            f"{name} needs >= {MIN_PREFIX_CHUNK_SIZES} distinct chunk sizes and >= {MIN_PREFIX_PREFIXES} distinct "
            f"prefixes, has {num_chunks} and {num_prefixes}"
        )
    return None


def design(name: str, prefix_len, chunk_size, terms=None) -> np.ndarray:
    """Columns of the model's regressors, intercept included as a column of ones (used for the condition number).

    quadratic: [1, l, l^2] with l = chunk_size, for its prefix-free rows only (pass those).
    """
    L = np.asarray(prefix_len, dtype=float)
    x = np.asarray(chunk_size, dtype=float)
    if name == "quadratic":
        return np.column_stack([np.ones_like(x), x, x * x])
    cols = {"c": np.ones_like(L), "g": L, "b": x, "a": 2.0 * L * x + x * x, "h": L * x * x}
    return np.column_stack([cols[t] for t in (terms or MODEL_TERMS[name])])
