"""Which fitted latency model a policy carries and whether it is adequate: the rows fitted (the warm-up rows dropped),
every candidate fitted on them, the one that best predicts work it never saw, and its checks (ppprof.fit.gates)."""

from __future__ import annotations

import numpy as np

from ppprof.config import ChunkSettings
from ppprof.fit.confidence import form_check
from ppprof.fit.crossval import CHOICE_RULE, choose_model
from ppprof.fit.gates import adequacy, failure_reason, predicted_shrink, row_gates
from ppprof.fit.regress import Fit, diagnostics, fit_candidates
from ppprof.fit.samples import Samples
from ppprof.policy.rule import MODEL_NAMES, LatencyModel

CANDIDATE_KEYS = ("cv_mape", "held_out_mape", "r2", "mape", "num_outliers_dropped", "rows")


def warmup_rows(prefix_len: np.ndarray) -> list[int]:
    """0-based rows not fitted: the first row (it ran cold) and the first prefix-free row (SGLang drops it)."""
    rows = {0} if len(prefix_len) else set()
    free = np.flatnonzero(prefix_len == 0)
    if free.size:
        rows.add(int(free[0]))
    return sorted(rows)


def without_warmup(samples: Samples) -> tuple[Samples, list[int]]:
    """The rows fitted (warmup_rows dropped) and the 0-based rows dropped: what the policy's fit and the adaptive
    design's bootstrap both read."""
    dropped = warmup_rows(samples.prefix_len)
    return samples.subset(~np.isin(np.arange(len(samples)), dropped)), dropped


def select_model(fitted: dict[str, Fit]) -> tuple[str, str] | None:
    """(name, score) of the fitted model that best predicts work it never saw, by CHOICE_RULE on each model's fold
    errors (held_out_mape's folds: prefix bands and chunk ranges held out; the row-wise cv_mape's k folds where there
    are fewer than two prefix bands or a model cannot be fitted in one of them): the least held-out error; where
    models are within noise of it, the least error at long prefixes, where the policy's chunks shrink; where they
    are within noise there too, the fewest coefficients (MODEL_NAMES order). None where none fitted; `pick` asks it
    among the models whose form passed."""
    if not fitted:
        return None
    key = "held_out_mape" if all(np.isfinite(f.held_out_mape) for f in fitted.values()) else "cv_mape"
    names = [n for n in MODEL_NAMES if n in fitted]
    first, long = ([getattr(fitted[n], k) for n in names] for k in ("folds", "long_folds"))
    if all(f is None for f in first) or all(f is None for f in long):  # a single row: the score alone
        return min(names, key=lambda k: (getattr(fitted[k], key), MODEL_NAMES.index(k))), key

    def stacked(arrays: list) -> np.ndarray:  # (models, 1, folds); inf for a model not fitted in some fold
        shape = next(a.shape for a in arrays if a is not None)
        return np.stack([np.full(shape, np.inf) if a is None else a for a in arrays])[:, None, :]

    return names[int(choose_model(stacked(first), stacked(long))[0])], key


def choice_set(fitted: dict[str, Fit], used: Samples) -> tuple[list[str], dict[str, dict]]:
    """(the fitted models the choice ranges over, {name: form check}): those whose form the cell medians of `used`
    bear out (ppprof.fit.confidence.form_check), all of them where none does."""
    forms = {n: form_check(f.model, used) for n, f in fitted.items()}
    adequate = [n for n in fitted if forms[n]["passed"]]
    return adequate or list(fitted), forms


def pick(fitted: dict[str, Fit], used: Samples) -> tuple[str, str, dict[str, dict]]:
    """(name, score, {name: form check}): select_model among choice_set's models; `fitted` must not be empty. The
    policy's choice, and the model the adaptive design bootstraps."""
    names, forms = choice_set(fitted, used)
    name, key = select_model({n: fitted[n] for n in names})
    return name, key, forms


def fit_used_rows(used: Samples, latency_model: str) -> tuple[dict[str, Fit], dict[str, str], dict[str, dict]]:
    """({name: Fit}, {name: why it could not be fitted}, {name: diagnostics}) of the candidates on the rows used."""
    if not len(used):
        return {}, {latency_model: "no samples left after dropping the warm-up row"}, {}
    L, x, y = used.prefix_len, used.chunk_size, used.chunk_latency_ms
    fitted, failed = fit_candidates(L, x, y, latency_model)
    per_model = {
        name: diagnostics(f.model, f.fit_rows, L, x, y, f.cv_mape) | {"held_out_mape": f.held_out_mape}
        for name, f in fitted.items()
    }
    return fitted, failed, per_model


def candidate_table(per_model: dict[str, dict], failed: dict[str, str]) -> dict[str, dict]:
    """The few diagnostics of every candidate kept in the policy, or why it could not be fitted."""
    candidates = {
        name: {k: d[k] for k in CANDIDATE_KEYS} | {"fit_r2": d["fit"]["r2"], "fit_rows": d["fit"]["rows"]}
        for name, d in per_model.items()
    }
    candidates.update({name: {"error": reason} for name, reason in failed.items()})
    return candidates


def select_and_gate(
    fitted: dict[str, Fit],
    failed: dict[str, str],
    per_model: dict[str, dict],
    diag: dict,
    settings: ChunkSettings,
    latency_model: str,
    used: Samples,
) -> tuple[LatencyModel | None, float | None, str, str]:
    """Pick the fitted model (select_model, among those whose form the cell medians of `used` bear out where any
    does: ppprof.fit.confidence.form_check), check its form and its condition number (ppprof.fit.gates.adequacy), add its diagnostics to `diag` (the per-row gates too, as diagnostics). Returns (model,
    target latency, status, reason): status dynamic while the model is adequate (the policy's gain then decides), a
    model that fails a check is kept, with status static."""
    if not fitted:
        return None, None, "static", "; ".join(failed.values())  # each reason names its model
    name, key, forms = pick(fitted, used)
    for n, form in forms.items():
        diag.setdefault("candidates", {}).setdefault(n, {})["form_error"] = form["value"]
    adequate = any(form["passed"] for form in forms.values())
    model = fitted[name].model
    diag["selected_by"] = (
        (key if adequate else f"{key} (no model's form passed)") if latency_model == "auto" else "requested"
    )
    if latency_model == "auto":
        diag["selection_rule"] = CHOICE_RULE
    diag.update(per_model[name])
    target = model.target_ms(settings.base_chunk_size)
    shrink, shrink_at = predicted_shrink(model, settings, target)  # SGLang's rule's, a diagnostic
    diag["predicted_shrink"] = {"fraction": shrink, "prefix_len": shrink_at}
    diag["gates"] = adequacy(forms[name], diag)
    diag["row_gates"] = row_gates(diag)
    reason = failure_reason(diag["gates"])
    if reason:
        return model, target, "static", reason
    if not target > 0:
        return model, target, "static", f"target latency {target:.4g} ms is not positive"
    form = diag["gates"][0]
    return (
        model,
        target,
        "dynamic",
        (
            f"{name} model adequate (cell medians within {form['value']:.1%} RMS of it, noise removed; condition "
            f"{diag['condition_number']:.3g})"
        ),
    )
