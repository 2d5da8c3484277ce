"""The live refit (`ppprof calibrate`): a policy's latency model fitted again on a server's own forwards (a forward
trace, ppprof.forwards), with the same model choice, form check and status by the decision's confidence as the
profile's fit (ppprof.fit.build), and the profile's samples only where the live forwards leave a region uncovered.

1. The forwards the fit takes (`live_forwards`): each (stage, TP rank)'s first forward dropped (it ran cold, as ATOM
   drops it), those reaching past the policy's context and the absurd ones (ABSURD_RATIO from their neighbours)
   skipped; all counted by reason.
2. The stage: the one whose live forwards took longest in all (the bottleneck, as the profile picks it).
3. Its single-request forwards are rows of the fit as they are; its packed batches are the packed forwards the policy
   prices (ppprof.fit.packed: the additive form and its per-piece term d, fitted on them, never in the model's fit).
4. The profile's samples (the policy's provenance.samples, where its sha256 still matches and the device is the
   trace's) fill the cells (power-of-two bands of prefix and chunk size) no live single-request forward falls in,
   their latencies times the live pace (the median of the live forwards' time over the policy's prediction of them,
   those in the profile's cells, where the model was fitted: the profile gives the shape there, the server the
   pace), a row weighing as much as a live forward; in a cell the live forwards cover, they alone count.
Pure numpy: no torch."""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import replace
from pathlib import Path

import numpy as np

from ppprof.config import ChunkSettings, PolicyOptions
from ppprof.config.workload import Workload
from ppprof.fit.build import fit_samples
from ppprof.fit.fitted import RunSamples, document
from ppprof.fit.live_forwards import LiveForwards, band, drift_rows, live_forwards, predicted_ms
from ppprof.fit.packed import PackedRows
from ppprof.fit.samples import Samples, read_samples
from ppprof.forwards import Forwards, read_forwards
from ppprof.io import finite, read_small_text
from ppprof.policy.policy_file import from_text, save
from ppprof.policy.rule import LatencyModel

WEIGHING = (
    "live single-request forwards as rows of the fit; the profile's samples only in the cells (power-of-two bands of "
    "prefix_len and chunk_size) no live single-request forward falls in, times the live pace (profile_pace: the "
    "median of live / the policy's prediction over the live forwards in the profile's cells), a row weighing as "
    "much as a live forward; "
    "packed batches priced by the additive form with its per-piece term fitted on them (packed_forwards), never in "
    "the model's fit"
)
LIVE_PROBE = 1_000_000
"""Live rows' probe ids start here (one per prefix band), apart from the profile's probes: the confidence's resampling
draws a probe's offset whole."""


def bottleneck(live: LiveForwards) -> int:
    """Step 2: the stage whose live forwards took longest in all."""
    stages = np.unique(live.stage)
    return int(stages[np.argmax([live.latency_ms[live.stage == s].sum() for s in stages])])


def check_match(policy: dict, forwards: Forwards, policy_path, trace_path) -> None:
    """ValueError (one line) where the trace is of another model or layout than the policy was profiled on."""
    prov, head = policy["report"].get("provenance") or {}, forwards.header
    shape, traced = prov.get("model_shape"), head.get("model_shape")
    pairs = [("model_shape", shape, traced)] if shape is not None and traced is not None else []
    pairs += [("pp_size", prov.get("pp_size"), head["pp_size"]), ("tp_size", prov.get("tp_size"), head["tp_size"])]
    for name, profiled, served in pairs:
        if profiled is not None and profiled != served:
            raise ValueError(
                f"forward trace {trace_path} is of another model or layout than policy {policy_path} ({name} "
                f"{served!r} served, {profiled!r} profiled): give the trace of a server of the policy's model"
            )


def profile_samples(policy: dict, policy_path, device: str) -> tuple[Samples | None, str]:
    """The profile's samples (provenance.samples, as written or beside the policy) where their sha256 still matches
    and the profile ran on the trace's device; else None, and why."""
    prov = policy["report"].get("provenance") or {}
    name = prov.get("samples")
    profiled_on = ((prov.get("hardware") or {}).get("device")) or None
    if not isinstance(name, str):
        return None, "the policy names no samples"
    if profiled_on is not None and profiled_on != device:
        return None, f"the profile ran on {profiled_on}, the trace on {device}"
    for path in (Path(name), Path(policy_path).with_name(Path(name).name)):
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == prov.get("samples_sha256"):
            return read_samples(path), f"{path} (sha256 {prov['samples_sha256'][:12]}...)"
    return None, f"{name} is not there with the sha256 the policy recorded"


def profile_pace(
    policy: dict, prefix: np.ndarray, size: np.ndarray, ms: np.ndarray, profile: Samples | None = None
) -> tuple[float, str]:
    """The live pace of the profile, and which forwards gave it: the median of the live single-request forwards'
    time over the policy's prediction of them (its model under its calibration, no per-chunk overhead), over those
    in the cells (power-of-two bands of prefix and chunk size) the profile's samples hold, where the model was
    fitted: a model wrong in shape (no prefix term) extrapolates its error into every other cell. Over all the live
    forwards where none falls in a profiled cell; 1 without a forward."""
    if not len(ms):
        return 1.0, "no live forward"
    model = LatencyModel.from_dict(policy["latency_model"]).planning(policy.get("calibration"), 0.0)
    predicted = np.asarray(model.chunk_latency_ms(prefix.astype(float), size.astype(float)), dtype=float)
    ok = predicted > 0
    words = "all the live forwards"
    if profile is not None and len(profile):
        profiled = set(zip(band(profile.prefix_len).tolist(), band(profile.chunk_size).tolist()))
        inside = np.array([cell in profiled for cell in zip(band(prefix).tolist(), band(size).tolist())], dtype=bool)
        if (ok & inside).any():
            ok &= inside
            words = f"the {int(ok.sum())} live forwards in the profile's cells"
    if not ok.any():
        return 1.0, "no positive prediction"
    return float(np.median(ms[ok] / predicted[ok])), words


def rows_of(
    live: LiveForwards, stage: int, profile: Samples | None, traces: str, pace: float = 1.0
) -> tuple[Samples, int]:
    """Step 3 and 4: the fit's rows (the profile's filling cells first, their latencies times the live `pace`,
    then the live single-request forwards in time order) as Samples of `stage`; and how many rows came from the
    profile."""
    idx = [i for i in live.of_stage(stage) if len(live.pieces[i]) == 1]
    idx.sort(key=lambda i: live.time_s[i])
    prefix = np.array([live.pieces[i][0][0] for i in idx], dtype=np.int64)
    size = np.array([live.pieces[i][0][1] for i in idx], dtype=np.int64)
    ms = live.latency_ms[idx].astype(float)
    kind = ["live"] * len(idx)
    probe = LIVE_PROBE + band(prefix)
    if profile is not None:
        covered = set(zip(band(prefix).tolist(), band(size).tolist()))
        cells = zip(band(profile.prefix_len).tolist(), band(profile.chunk_size).tolist())
        fill = np.array([cell not in covered for cell in cells], dtype=bool)
        p = profile.subset(fill)
        ids = p.probe if p.probe is not None and np.all(np.isfinite(p.probe)) else p.prefix_len
        prefix, size = np.concatenate([p.prefix_len, prefix]), np.concatenate([p.chunk_size, size])
        ms, kind = np.concatenate([p.chunk_latency_ms * pace, ms]), ["profile"] * len(p) + kind
        probe = np.concatenate([np.asarray(ids, dtype=float), probe])
    n_profile = len(kind) - len(idx)
    digest = hashlib.sha256(traces.encode()).hexdigest()
    totals = [float(live.latency_ms[live.stage == s].sum()) for s in range(int(live.stage.max()) + 1)]
    samples = Samples(prefix, size, ms, np.array(kind), stage, totals, Path(traces), digest, probe)
    return samples, n_profile


def packed_rows(live: LiveForwards, stage: int, traces: str) -> PackedRows | None:
    """Step 3: the stage's packed batches as the packed forwards the policy prices; None without any."""
    idx = [i for i in live.of_stage(stage) if len(live.pieces[i]) > 1]
    if not idx:
        return None
    return PackedRows(
        tuple(np.array([p for p, _ in live.pieces[i]], dtype=np.int64) for i in idx),
        tuple(np.array([x for _, x in live.pieces[i]], dtype=np.int64) for i in idx),
        {stage: live.latency_ms[idx].astype(float)},
        Path(traces),
    )


def refit(policy: dict, policy_path, forwards: Forwards, trace_paths, latency_model: str | None = None) -> dict:
    """The policy refitted on the trace's forwards (module doc), its provenance naming the traces; nothing written.
    ValueError (one line) where the trace is of another model or leaves too few single-request forwards to fit."""
    check_match(policy, forwards, policy_path, trace_paths[0])
    settings = ChunkSettings(**policy["settings"])
    live = live_forwards(forwards, settings.context_len)
    if not len(live):
        raise ValueError(
            f"forward trace {trace_paths[0]} leaves no forward to fit ({live.skipped}): serve more requests"
        )
    stage = bottleneck(live)
    traces = " ".join(f["path"] for f in forwards.files)
    profile, profile_words = profile_samples(policy, policy_path, forwards.header["device"])
    single = [i for i in live.of_stage(stage) if len(live.pieces[i]) == 1]
    pace, pace_source = profile_pace(
        policy,
        np.array([live.pieces[i][0][0] for i in single], dtype=np.int64),
        np.array([live.pieces[i][0][1] for i in single], dtype=np.int64),
        live.latency_ms[single],
        profile,
    )
    samples, n_profile = rows_of(live, stage, profile, traces, pace)
    if len(samples) - n_profile < 3:
        raise ValueError(
            f"forward trace {trace_paths[0]} holds {len(samples) - n_profile} single-request forwards of stage "
            f"{stage} the fit can take: serve more requests alone (e.g. serve-bench --concurrency 1)"
        )
    workload = policy["report"].get("workload")
    options = PolicyOptions(
        overhead_ms=float(policy["overhead"]["ms_per_chunk"]),
        pp_size=policy.get("num_stages"),
        # a workload the policy derived from its profiled domain is derived again from the domain the live
        # forwards reach; one the user gave stays
        workload=Workload.from_dict(workload) if workload and workload.get("source") != "default" else None,
    )
    requested = latency_model or (policy["report"].get("diagnostics") or {}).get("requested_model") or "auto"
    contract, report = fit_samples(
        RunSamples(samples, None, packed_rows(live, stage, traces)), settings, options, requested
    )
    live_words = {
        "n_profile": n_profile,
        "pace": pace,
        "pace_source": pace_source,
        "profile": profile_words,
        "stage": stage,
    }
    provenance = (policy["report"].get("provenance") or {}) | {
        "created_at": report.provenance["created_at"],
        "ppprof_version": report.provenance["ppprof_version"],
        "bottleneck_stage": stage,
        "live": live_provenance(forwards, live, len(samples) - n_profile, live_words, policy_path),
    }
    return finite(document(contract, replace(report, provenance=provenance)))


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(float(t), dt.timezone.utc).isoformat(timespec="seconds")


def read_policy(path) -> dict:
    """The policy file's data, checked as `load` checks it; one-line ValueError otherwise."""
    text = read_small_text(path, "policy", "give a policy.json written by `ppprof fit` or `ppprof profile`")
    return dict(from_text(text, f"policy {path}").data)


def calibrate(policy_path, trace_paths, out=None, latency_model: str | None = None) -> tuple[Path, dict, list[dict]]:
    """`ppprof calibrate`: read the policy and the traces (bounded, checked), refit, write the new policy atomically
    (default: <policy>-calibrated.json beside it; never over POLICY itself) and return (its path, it, the drift
    rows: per stage and prefix band, the live median against the profiled and the calibrated predictions). Bad
    input: one-line ValueError, nothing written."""
    policy_path = Path(policy_path)
    out = Path(out) if out is not None else policy_path.with_name(f"{policy_path.stem}-calibrated.json")
    if out.resolve() == policy_path.resolve():
        raise ValueError(f"-o {out} is POLICY itself: write the calibrated policy to another file")
    policy = read_policy(policy_path)
    if policy.get("latency_model") is None:
        raise ValueError(f"policy {policy_path} has no latency model ({policy.get('reason')}): profile again")
    forwards = read_forwards(trace_paths)
    new = refit(policy, policy_path, forwards, list(trace_paths), latency_model)
    live = live_forwards(forwards, int(policy["settings"]["context_len"]))
    both = {"profiled": policy} | ({"calibrated": new} if new.get("latency_model") else {})
    preds = {name: predicted_ms(p, live) for name, p in both.items()}
    rows = drift_rows(preds, live, int(policy["settings"]["base_chunk_size"]))
    return save(out, new), new, rows


def live_provenance(forwards: Forwards, live: LiveForwards, single: int, words: dict, policy_path) -> dict:
    """provenance.live: the traces, the forwards read, used and dropped, their time span, the profile's rows and
    their pace, how the two are weighed, the source policy."""
    stage = words["stage"]
    start, end = live.time_s.min(), live.time_s.max()
    return {
        "traces": [{k: f[k] for k in ("path", "sha256", "forwards", "dropped_by_writer")} for f in forwards.files],
        "server": forwards.header["server"],
        "server_version": forwards.header["server_version"],
        "device": forwards.header["device"],
        "stage": stage,
        "forwards_read": len(forwards),
        "forwards_used": {"single": single, "packed": sum(1 for i in live.of_stage(stage) if len(live.pieces[i]) > 1)},
        "forwards_dropped": live.skipped | {"of other stages": int(np.sum(live.stage != stage))},
        "time_span": [iso(start), iso(end)],
        "time_span_s": float(end - start),
        "profile_rows": words["n_profile"],
        "profile_pace": words["pace"],
        "profile_pace_source": words["pace_source"],
        "profile_samples": words["profile"],
        "weighing": WEIGHING,
        "policy": str(policy_path),
        "policy_sha256": hashlib.sha256(Path(policy_path).read_bytes()).hexdigest(),
    }
