"""From samples to a policy: resolve settings, fit, pick the model, apply the quality gates, write the file and plots.

Quality gates (ATOM's, with CPU-timing slack on the CV bound); any failure gives a `static` policy with the reason:
  RMS residual <= 25% of the mean latency and k-fold CV MAPE <= 10%, both over every evaluation row (prefix-free and
  prefixed) with the planner's chunk latency; condition number of the unit-column design of the fitted rows <= 100;
  and the policy's own chunks (smoothed, floored, aligned) must shrink by >= 5% before the context cap bites.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import numpy as np

from ppprof import __version__
from ppprof.fit.regress import diagnostics, fit_candidates
from ppprof.fit.samples import Samples, provenance, read_run, read_samples
from ppprof.plotting import pyplot, save_figure
from ppprof.policy.rule import MODEL_NAMES, ChunkSettings, LatencyModel, next_chunk_size
from ppprof.policy.schema import RULE_TEXT, SCHEMA_VERSION, make_table, save
from ppprof.runfiles import SAMPLES_FILE

LATENCY_MODEL_CHOICES = MODEL_NAMES + ("auto",)
DEFAULT_SMOOTH_FACTOR = 0.75
DEFAULT_CONTEXT_LEN = 131072
MAX_RMS_FRACTION = 0.25
MAX_CONDITION_NUMBER = 100.0
MAX_CV_MAPE = 0.10
MIN_SHRINK = 0.05
POLICY_FILE = "policy.json"
FIT_PLOT = "fit.png"
CHUNKS_PLOT = "chunks.png"
MAX_PREFIX_CURVES = 8
CANDIDATE_KEYS = ("cv_mape", "r2", "mape", "num_outliers_dropped", "rows")


def resolve_settings(run: dict | None, samples_path: Path, *, base_chunk_size=None, smooth_factor=None,
                     page_size=None, alignment=None, min_chunk_size=None, max_chunk_size=None,
                     context_len=None) -> ChunkSettings:
    """Options given win; the rest come from run.json's config, then from defaults."""
    config = (run or {}).get("config", {})
    if base_chunk_size is None:
        base_chunk_size = config.get("base_chunk_size")
        if base_chunk_size is None:
            raise ValueError(f"--base-chunk-size is required: there is no run.json with config.base_chunk_size "
                             f"beside {samples_path}")
    return ChunkSettings(
        base_chunk_size=base_chunk_size,
        smooth_factor=DEFAULT_SMOOTH_FACTOR if smooth_factor is None else smooth_factor,
        page_size=page_size if page_size is not None else config.get("page_size", 1),
        alignment=alignment or 0,
        min_chunk_size=min_chunk_size or 0,
        max_chunk_size=max_chunk_size or 0,
        context_len=context_len if context_len is not None else config.get("context_len", DEFAULT_CONTEXT_LEN),
    )


def predicted_shrink(model, settings: ChunkSettings, target_ms: float) -> tuple[float, int]:
    """1 - (policy chunk at the deepest history before the context cap) / (the largest later chunk the caps allow,
    min(B, max_chunk_size)), and that history length. Measured against the cap, so that a max_chunk_size below B
    does not pass for a shrink the model predicts."""
    L = max(1, settings.context_len - settings.context_margin - settings.max_chunk_size)
    size = next_chunk_size(model, settings, target_ms, L)
    return 1.0 - size / min(settings.base_chunk_size, settings.max_chunk_size), L


def gates(diag: dict, shrink: float) -> list[dict]:
    checks = [
        ("rms_residual_fraction", diag["rms_residual_ms"] / diag["mean_latency_ms"], "<=", MAX_RMS_FRACTION),
        ("condition_number", diag["condition_number"], "<=", MAX_CONDITION_NUMBER),
        ("cv_mape", diag["cv_mape"], "<=", MAX_CV_MAPE),
        ("predicted_shrink", shrink, ">=", MIN_SHRINK),
    ]
    return [{"name": n, "value": v, "op": op, "limit": lim, "passed": bool(v <= lim if op == "<=" else v >= lim)}
            for n, v, op, lim in checks]


def warmup_rows(prefix_len: np.ndarray) -> list[int]:
    """0-based rows not fitted: the first row (it ran cold) and the first prefix-free row (SGLang drops it)."""
    rows = {0} if len(prefix_len) else set()
    free = np.flatnonzero(prefix_len == 0)
    if free.size:
        rows.add(int(free[0]))
    return sorted(rows)


def fit_samples(samples: Samples, run: dict | None, settings: ChunkSettings, latency_model: str = "auto") -> dict:
    """Fit and gate; return the policy dict (nothing is written)."""
    if latency_model not in LATENCY_MODEL_CHOICES:
        raise ValueError(f"--latency-model {latency_model} is unknown: use one of {', '.join(LATENCY_MODEL_CHOICES)}")
    # The first timed request ran cold (no warm-up), and SGLang drops the first of its prefix-free probes: both go
    # (one row when the file starts with a prefix-free request, as `ppprof profile` writes it).
    dropped = warmup_rows(samples.prefix_len)
    used = samples.subset(~np.isin(np.arange(len(samples)), dropped))
    L, x, y = used.prefix_len, used.chunk_len, used.latency_ms
    if len(used):
        fitted, failed = fit_candidates(L, x, y, latency_model)
    else:
        fitted, failed = {}, {latency_model: "no samples left after dropping the warm-up row"}
    per_model = {name: diagnostics(f.model, f.fit_rows, L, x, y, f.cv_mape) for name, f in fitted.items()}
    candidates = {name: {k: d[k] for k in CANDIDATE_KEYS} | {"fit_r2": d["fit"]["r2"], "fit_rows": d["fit"]["rows"]}
                  for name, d in per_model.items()}
    candidates.update({name: {"error": reason} for name, reason in failed.items()})
    diag = {"requested_model": latency_model, "dropped_warmup_rows": [int(i) + 1 for i in dropped],
            "candidates": candidates, "bottleneck_stage": samples.stage_idx,
            "stage_totals_ms": samples.stage_totals_ms}
    model, target, status = None, None, "static"
    if not fitted:
        reason = "; ".join(failed.values())  # each reason names its model
    else:
        name = min(fitted, key=lambda k: (fitted[k].cv_mape, MODEL_NAMES.index(k)))
        model = fitted[name].model
        diag["selected_by"] = "cv_mape" if latency_model == "auto" else "requested"
        diag.update(per_model[name])
        target = model.target_ms(settings.base_chunk_size)
        shrink, shrink_at = predicted_shrink(model, settings, target)
        diag["predicted_shrink"] = {"fraction": shrink, "history_len": shrink_at}
        diag["gates"] = gates(diag, shrink)
        failed_gates = [g for g in diag["gates"] if not g["passed"]]
        if failed_gates:
            reason = "; ".join(f"gate {g['name']} = {g['value']:.4g} fails {g['op']} {g['limit']:g}"
                               for g in failed_gates)
        elif not target > 0:
            reason = f"target latency {target:.4g} ms is not positive"
        else:
            status, reason = "dynamic", f"{name} model passed all quality gates"
    prov = provenance(run, samples)
    prov.update({"created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                 "ppprof_version": __version__})
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
        "table": make_table(model, settings, target, status),
    })


def finite(obj):
    """Replace inf / nan (e.g. a CV error that could not be computed) by None, so the file is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj


def fit(samples_path: str | Path, out: str | Path | None = None, latency_model: str = "auto", *,
        plots: bool = False, **options) -> tuple[Path, dict]:
    """Read, fit, gate and write the policy (default: policy.json beside the samples); with `plots`, also fit.png
    and chunks.png beside the policy. Returns (path, policy)."""
    samples_path = Path(samples_path)
    samples = read_samples(samples_path)
    run = read_run(samples_path)
    settings = resolve_settings(run, samples_path, **options)
    policy = fit_samples(samples, run, settings, latency_model)
    out = Path(out) if out is not None else samples_path.parent / POLICY_FILE
    path = save(out, policy)
    if plots:
        write_plots(samples, policy, path.parent)
    return path, policy


def fit_run(run_dir: str | Path) -> Path:
    """Fit `run_dir/samples.csv` with the defaults of `run_dir/run.json`; write `run_dir/policy.json`, `fit.png`
    (measured latency vs chunk length with the fitted curve per prefix) and `chunks.png` (chunk size vs history).

    Signature: fit_run(run_dir: str | Path) -> Path of the policy written. Raises ValueError on unreadable input,
    before anything is written. A model that fails the quality gates still gives a (static) policy, not an error.
    """
    return fit(Path(run_dir) / SAMPLES_FILE, plots=True)[0]


def num(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def summary(path: Path, policy: dict) -> str:
    """A few lines for people."""
    diag = policy["diagnostics"]
    s = policy["settings"]
    lines = [f"policy {path}: {policy['status']} ({policy['reason']})"]
    if policy["latency_model"]:
        coefs = policy["latency_model"]["coefficients"]
        terms = ", ".join(f"{k}={v['value']:.4g} {v['unit']}" for k, v in coefs.items())
        lines.append(f"model {policy['latency_model']['name']}: {terms}; target {policy['target_latency_ms']:.4g} ms")
        lines.append(f"scored on {diag['rows']}: R^2 {num(diag['r2'], '.4f')}, MAPE {num(diag['mape'], '.2%')}, "
                     f"worst residual {num(diag['worst_residual']['residual_ms'], '.3g')} ms; CV MAPE "
                     f"{num(diag['cv_mape'], '.2%')} (every row held out once)")
        lines.append(f"fitted to {diag['fit']['rows']}: R^2 {num(diag['fit']['r2'], '.4f')}; condition "
                     f"{num(diag['condition_number'], '.3g')}")
    others = {k: v for k, v in diag["candidates"].items() if not policy["latency_model"]
              or k != policy["latency_model"]["name"]}
    for name, c in others.items():
        lines.append(f"{name} (not selected): " + (c["error"] if "error" in c else
                     f"R^2 {num(c['r2'], '.4f')}, CV MAPE {num(c['cv_mape'], '.2%')}"))
    if diag.get("bottleneck_stage") is not None:
        lines.append(f"bottleneck stage {diag['bottleneck_stage']} (largest total latency)")
    shrink = diag.get("predicted_shrink")
    largest = min(s["base_chunk_size"], s["max_chunk_size"])
    deep = "" if not shrink else (f", {largest * (1 - shrink['fraction']):.0f} at history "
                                  f"{shrink['history_len']} if dynamic")
    lines.append(f"chunks: base {s['base_chunk_size']}{deep}; alignment {s['alignment']}, smooth "
                 f"{s['smooth_factor']:g}, floor {s['min_chunk_size']}, cap {s['max_chunk_size']}, "
                 f"{len(policy['table']['chunk_size'])} table entries")
    return "\n".join(lines)


def plot_fit(samples: Samples, model: LatencyModel | None, title: str):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    prefixes = np.unique(samples.prefix_len)
    shown = prefixes if len(prefixes) <= MAX_PREFIX_CURVES else prefixes[
        np.unique(np.linspace(0, len(prefixes) - 1, MAX_PREFIX_CURVES).astype(int))]
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(shown)))
    ax.scatter(samples.chunk_len, samples.latency_ms, s=6, color="0.7", label="all samples")
    for prefix, color in zip(shown, colors):
        sel = samples.prefix_len == prefix
        ax.scatter(samples.chunk_len[sel], samples.latency_ms[sel], s=8, color=color, label=f"prefix {prefix}")
        if model is not None:
            x = np.linspace(max(1, samples.chunk_len.min()), samples.chunk_len.max(), 100)
            ax.plot(x, model.chunk_latency_ms(np.full_like(x, prefix), x), color=color, lw=1.2)
    ax.set_xlabel("chunk_len (tokens)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def plot_chunks(policy: dict):
    plt = pyplot()
    starts = policy["table"]["history_len"]
    sizes = policy["table"]["chunk_size"]
    context_len = policy["settings"]["context_len"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.step(list(starts) + [context_len], list(sizes) + [sizes[-1]], where="post")
    ax.set_xlabel("history_len (tokens)")
    ax.set_ylabel("next chunk size (tokens)")
    ax.set_title(f"{policy['status']}: {policy['reason']}"[:110], fontsize=9)
    ax.set_ylim(bottom=0)
    return fig


def write_plots(samples: Samples, policy: dict, out_dir: Path) -> list[Path]:
    """Write FIT_PLOT and CHUNKS_PLOT into `out_dir` (each atomically)."""
    model = LatencyModel.from_dict(policy["latency_model"]) if policy["latency_model"] else None
    title = f"{model.name if model else 'no model'}; stage {samples.stage_idx}" if samples.stage_idx is not None \
        else (model.name if model else "no model")
    paths = [save_figure(plot_fit(samples, model, title), Path(out_dir) / FIT_PLOT, bbox_inches="tight")]
    paths.append(save_figure(plot_chunks(policy), Path(out_dir) / CHUNKS_PLOT, bbox_inches="tight"))
    return paths
