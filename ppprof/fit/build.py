"""From samples to a policy: drop the warm-up rows, fit the candidate models, select and gate one, assemble the
policy dict and write it (with the plots where asked)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np

from ppprof import __version__
from ppprof.fit.gates import failure_reason, gates, predicted_shrink
from ppprof.io import finite
from ppprof.fit.parity import sglang_fit
from ppprof.fit.plots import write_plots
from ppprof.fit.regress import Fit, diagnostics, fit_candidates
from ppprof.fit.samples import Samples, provenance, read_run, read_samples
from ppprof.fit.settings import LATENCY_MODEL_CHOICES, resolve_settings
from ppprof.config import ChunkSettings
from ppprof.policy.rule import MODEL_NAMES, LatencyModel
from ppprof.policy.schema import RULE_TEXT, SCHEMA_VERSION, make_table, save
from ppprof.runfiles import SAMPLES_FILE
from ppprof.servers.sglang import PARITY

POLICY_FILE = "policy.json"
PROFILE_LATENCY_MODEL = "auto"
"""The latency model a profile's own fit (fit_run) asks for, and so the one its adaptive design judges."""
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
    """(name, score) of the fitted model that best predicts work it never saw (held_out_mape: prefix bands and chunk
    ranges held out; the row-wise cv_mape where there are fewer than two prefix bands; ties: MODEL_NAMES order);
    None where none fitted. The policy's choice, and the model the adaptive design bootstraps."""
    if not fitted:
        return None
    key = "held_out_mape" if all(np.isfinite(f.held_out_mape) for f in fitted.values()) else "cv_mape"
    return min(fitted, key=lambda k: (getattr(fitted[k], key), MODEL_NAMES.index(k))), key


def fit_used_rows(used: Samples, latency_model: str) -> tuple[dict[str, Fit], dict[str, str], dict[str, dict]]:
    """({name: Fit}, {name: why it could not be fitted}, {name: diagnostics}) of the candidates on the rows used."""
    if not len(used):
        return {}, {latency_model: "no samples left after dropping the warm-up row"}, {}
    L, x, y = used.prefix_len, used.chunk_size, used.chunk_latency_ms
    fitted, failed = fit_candidates(L, x, y, latency_model)
    per_model = {name: diagnostics(f.model, f.fit_rows, L, x, y, f.cv_mape) | {"held_out_mape": f.held_out_mape}
                 for name, f in fitted.items()}
    return fitted, failed, per_model


def candidate_table(per_model: dict[str, dict], failed: dict[str, str]) -> dict[str, dict]:
    """The few diagnostics of every candidate kept in the policy, or why it could not be fitted."""
    candidates = {name: {k: d[k] for k in CANDIDATE_KEYS} | {"fit_r2": d["fit"]["r2"], "fit_rows": d["fit"]["rows"]}
                  for name, d in per_model.items()}
    candidates.update({name: {"error": reason} for name, reason in failed.items()})
    return candidates


def select_and_gate(fitted: dict[str, Fit], failed: dict[str, str], per_model: dict[str, dict], diag: dict,
                    settings: ChunkSettings, latency_model: str) -> tuple[LatencyModel | None, float | None, str, str]:
    """Pick the fitted model (select_model), gate it and add its diagnostics to `diag`. Returns (model, target
    latency, status, reason); a model that fails a gate is kept, with status static."""
    if not fitted:
        return None, None, "static", "; ".join(failed.values())  # each reason names its model
    name, key = select_model(fitted)
    model = fitted[name].model
    diag["selected_by"] = key if latency_model == "auto" else "requested"
    diag.update(per_model[name])
    target = model.target_ms(settings.base_chunk_size)
    shrink, shrink_at = predicted_shrink(model, settings, target)
    diag["predicted_shrink"] = {"fraction": shrink, "prefix_len": shrink_at}
    diag["gates"] = gates(diag, shrink)
    reason = failure_reason(diag["gates"])
    if reason:
        return model, target, "static", reason
    if not target > 0:
        return model, target, "static", f"target latency {target:.4g} ms is not positive"
    return model, target, "dynamic", f"{name} model passed all quality gates"


def fit_samples(samples: Samples, run: dict | None, settings: ChunkSettings, latency_model: str = "auto",
                parity: str | None = None) -> dict:
    """Fit and gate; return the policy dict (nothing is written). parity PARITY: SGLang's own fit instead
    (ppprof.fit.parity), for the quadratic model only."""
    if latency_model not in LATENCY_MODEL_CHOICES:
        raise ValueError(f"--latency-model {latency_model} is unknown: use one of {', '.join(LATENCY_MODEL_CHOICES)}")
    if parity is not None:
        if parity != PARITY or latency_model != "quadratic":
            raise ValueError(f"--parity {parity} with --latency-model {latency_model}: parity is '{PARITY}' and needs "
                             "--latency-model quadratic (the only model SGLang fits)")
        model, reason, diag = sglang_fit(samples)
        diag.update({"requested_model": latency_model, "bottleneck_stage": samples.bottleneck_stage})
        target = None if model is None else model.target_ms(settings.base_chunk_size)
        return assemble(samples, run, settings, model, target, "dynamic" if model else "static", reason, diag)
    # The first timed request ran cold (no warm-up), and SGLang drops the first of its prefix-free probes: both go
    # (one row when the file starts with a prefix-free request, as `ppprof profile` writes it).
    used, dropped = without_warmup(samples)
    fitted, failed, per_model = fit_used_rows(used, latency_model)
    diag = {"requested_model": latency_model, "dropped_warmup_rows": [int(i) + 1 for i in dropped],
            "candidates": candidate_table(per_model, failed), "bottleneck_stage": samples.bottleneck_stage,
            "stage_totals_ms": samples.stage_totals_ms}
    model, target, status, reason = select_and_gate(fitted, failed, per_model, diag, settings, latency_model)
    return assemble(samples, run, settings, model, target, status, reason, diag)


def assemble(samples: Samples, run: dict | None, settings: ChunkSettings, model: LatencyModel | None,
             target: float | None, status: str, reason: str, diag: dict) -> dict:
    """The policy dict: the model, the rule's settings, diagnostics, provenance, domain and table."""
    prov = provenance(run, samples)
    prov.update({"created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                 "ppprof_version": __version__})
    # How the samples were collected, as run.json records it (absent for a plain CSV or an older run).
    design = {"design": (run or {})["design"]} if isinstance((run or {}).get("design"), dict) else {}
    return finite({
        "schema_version": SCHEMA_VERSION,
        "status": status,
        "reason": reason,
        "latency_model": None if model is None else model.to_dict(),
        "settings": settings.to_dict(),
        "target_latency_ms": target,
        "target_chunk_latency_ms": None if model is None else model.c + target,
        "rule": RULE_TEXT,
        "diagnostics": diag,
        "provenance": prov,
        "domain": domain(samples),
        "table": make_table(model, settings, target, status),
        **design,
    })


def domain(samples: Samples) -> dict:
    """The prefix and chunk ranges the samples measured: where the latency model is interpolated, not extrapolated."""
    return {"prefix_len": [int(samples.prefix_len.min()), int(samples.prefix_len.max())],
            "chunk_size": [int(samples.chunk_size.min()), int(samples.chunk_size.max())],
            "prefix_lens": sorted(int(p) for p in set(samples.prefix_len.tolist()))}


def fit(samples_path: str | Path, out: str | Path | None = None, latency_model: str = "auto", *,
        plots: bool = False, parity: str | None = None, **options) -> tuple[Path, dict]:
    """Read, fit, gate and write the policy (default: policy.json beside the samples); with `plots`, also fit.png
    and chunks.png beside the policy. Returns (path, policy)."""
    samples_path = Path(samples_path)
    samples = read_samples(samples_path)
    run = read_run(samples_path)
    settings = resolve_settings(run, samples_path, **options)
    policy = fit_samples(samples, run, settings, latency_model, parity)
    out = Path(out) if out is not None else samples_path.parent / POLICY_FILE
    path = save(out, policy)
    if plots:
        write_plots(samples, policy, path.parent)
    return path, policy


def fit_run(run_dir: str | Path) -> Path:
    """Fit `run_dir/samples.csv` with the defaults of `run_dir/run.json`; write `run_dir/policy.json`, `fit.png`
    (measured latency vs chunk_size with the fitted curve per prefix) and `chunks.png` (chunk size vs prefix_len).

    Signature: fit_run(run_dir: str | Path) -> Path of the policy written. Raises ValueError on unreadable input,
    before anything is written. A model that fails the quality gates still gives a (static) policy, not an error.
    """
    return fit(Path(run_dir) / SAMPLES_FILE, latency_model=PROFILE_LATENCY_MODEL, plots=True)[0]
