"""From samples to a policy, in one pass over samples held in memory (`fit_samples`: RunSamples in, the contract
and the report out): drop the warm-up rows, fit the candidate models, select and gate one, choose the rules, score the
packed forwards, choose the under-load rule. `fit_and_save` writes what it returns (with the plots where asked);
`fit` (`ppprof fit`) first reads the checkpoint files."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, replace
from pathlib import Path

from ppprof import __version__
from ppprof.checks import is_number
from ppprof.config import ChunkSettings, PolicyOptions
from ppprof.config.workload import Workload
from ppprof.fit.calibrate import calibration_of
from ppprof.fit.calibrate import none as no_calibration
from ppprof.fit.confidence import RESAMPLES, SEED, Pricing, gain_interval, plans_by_model, rechosen_refits
from ppprof.fit.fitted import RunSamples, document
from ppprof.fit.packed import packed_forwards
from ppprof.fit.parity import sglang_fit
from ppprof.fit.plots import write_plots
from ppprof.fit.samples import Samples, provenance
from ppprof.fit.selection import candidate_table, choice_set, fit_used_rows, select_and_gate, without_warmup
from ppprof.fit.settings import LATENCY_MODEL_CHOICES, resolve_policy_options, resolve_settings
from ppprof.io import finite
from ppprof.policy.builders import build_prompt_rule
from ppprof.policy.choice import choose, default_workload, rule_domain
from ppprof.policy.policy_file import save
from ppprof.policy.rule import LatencyModel, build_table
from ppprof.policy.runtime import Policy, Report, flattened, nested
from ppprof.policy.schema import SCHEMA_VERSION
from ppprof.policy.tables import RULE_TEXT, PromptRule
from ppprof.runfiles import RunFolder, recorded_stages
from ppprof.servers.sglang import PARITY
from ppprof.serving.underload import choose_load

PROFILE_LATENCY_MODEL = "auto"
"""The latency model a profile's own fit asks for, and so the one its adaptive design judges."""


def overhead_of(run: dict | None, given: float | None) -> dict:
    """The per-chunk pipeline overhead the policy plans with: the one given, else the profile's measured one (run.json
    pipeline_overhead; a negative median counts as 0), else none (0)."""
    if given is not None:
        return {"ms_per_chunk": given, "stderr_ms": None, "source": "given"}
    measured = (run or {}).get("pipeline_overhead")
    if isinstance(measured, dict) and is_number(measured.get("ms_per_chunk")):
        stderr = measured.get("stderr_ms")
        return {
            "ms_per_chunk": max(0.0, float(measured["ms_per_chunk"])),
            "stderr_ms": float(stderr) if is_number(stderr) else None,
            "source": "measured",
            "measured_ms_per_chunk": float(measured["ms_per_chunk"]),
            "by_chunk_size": measured.get("by_chunk_size"),
            "method": measured.get("method"),
        }
    return {"ms_per_chunk": 0.0, "stderr_ms": None, "source": "none"}


def profiled_stages(run: dict | None, samples: Samples | None = None) -> int:
    """The pipeline stages of the profile as its run record says (runfiles.recorded_stages); without a run.json
    that says, the samples' stage columns (a samples.csv of 4 stages plans for 4); else 1."""
    stages = recorded_stages(run)
    if stages is not None:
        return stages
    return len(samples.stage_totals_ms) if samples is not None and samples.stage_totals_ms else 1


@dataclass(frozen=True, slots=True)
class Gated:
    """The fit's outcome before the rules: the model (None: none passed), the status its gates give and why, the
    profile's calibration of it (None: not measured), the resampled fits whose gains give the interval the status
    reads ((models, chosen, point fits) of confidence.rechosen_refits; None: the point gain alone decides), and
    whether it is SGLang's own fit (`parity`: its own rule, as its server would run it)."""

    model: LatencyModel | None
    status: str
    reason: str
    calibration: dict | None = None
    resampled: tuple[list, list[str], dict[str, LatencyModel]] | None = None
    parity: bool = False


def carried(
    gated: Gated, settings: ChunkSettings, measured: dict | None, run: dict | None, options: PolicyOptions
) -> dict:
    """The policy's fields beyond the fit: overhead, calibration, stages, workload, the history-only table, the
    prompt-aware rule, what they are predicted to give, and the status and reason that follow. `measured`: the
    profiled domain, None for none (chunks up to B, prompts up to the context). The rules are chosen on the planning
    model (LatencyModel.planning)."""
    model, status, reason, resampled = gated.model, gated.status, gated.reason, gated.resampled
    overhead = overhead_of(run, options.overhead_ms)
    calibration = gated.calibration or no_calibration("not measured")
    stages = options.pp_size or profiled_stages(run)
    dom = rule_domain(settings, measured, options.extrapolate)
    workload = options.workload or Workload(*map(tuple, default_workload(settings, dom)))
    lengths = list(workload.prompt_lens)
    out = {"overhead": overhead, "calibration": calibration, "num_stages": stages, "workload": workload.to_dict()}
    if model is None or status == "static" or gated.parity:
        size = settings.base_chunk_size
        table = {"prefix_len": [0], "chunk_size": [size]}
        rule = PromptRule.fixed(size)
        if gated.parity and model is not None and status == "dynamic":  # SGLang's own rule, as its server runs it
            starts, sizes = build_table(model, settings, model.target_ms(size))
            table = {"prefix_len": starts, "chunk_size": sizes}
            rule = PromptRule([1], [math.inf], [0], [starts], [sizes], max(sizes))
        fields = {"status": status, "reason": reason, "table": table, "prompt_table": rule.to_dict(dom)}
        return out | fields | {"predicted": None}

    def planning(m: LatencyModel) -> LatencyModel:
        return m.planning(calibration, overhead["ms_per_chunk"])

    def interval(rule: PromptRule) -> dict:  # the gain over resampled fits, each pricing its model's plans
        models, chosen, point = resampled

        def own(name: str) -> list[list[int]]:  # the plans of the rule that model's point fit gives
            return [r.plan(int(n)) for r in [build_prompt_rule(planning(point[name]), dom, stages)[0]] for n in lengths]

        plans = plans_by_model([rule.plan(int(n)) for n in lengths], model.name, chosen, own)
        return gain_interval(models, planning, plans, Pricing(workload, stages, dom.sizes()), options.min_gain, chosen)

    judge = interval if resampled else None
    choice = choose(planning(model), settings, dom, stages, workload, options.min_gain, judge)
    table = choice.history_table | {
        "bound_ms": choice.history_bound_ms if math.isfinite(choice.history_bound_ms) else None,
        "chunk_cap": choice.history_chunk_cap,
    }
    return out | {
        "status": choice.status,
        "reason": f"{reason}; {choice.reason}",
        "table": table,
        "prompt_table": choice.prompt_rule.to_dict(dom),
        "predicted": choice.predicted,
    }


def fit_samples(
    measured: RunSamples,
    settings: ChunkSettings,
    options: PolicyOptions | None = None,
    latency_model: str = "auto",
    parity: str | None = None,
) -> tuple[Policy, Report]:
    """The fit, in one pass over samples held in memory: fit and gate the latency model (parity PARITY: SGLang's own
    fit and rule instead, ppprof.fit.parity, for the quadratic model only), choose the rules (ppprof.policy.choice),
    score the model on the packed forwards where there are any (ppprof.fit.packed), and choose the under-load rule
    (ppprof.serving.underload; options.load_rule False: none). Returns the contract a server reads and the report
    beside it (ppprof.fit.fitted.document joins them into policy.json's document); nothing is read or written."""
    samples, run = measured.samples, measured.run
    options = options or PolicyOptions()
    if options.pp_size is None:  # the profile's stages, or the samples' where no run.json says
        options = replace(options, pp_size=profiled_stages(run, samples))
    gated, target, diag = gate(samples, latency_model, parity, settings)
    gated = replace(gated, calibration=calibration_of(run, gated.model, samples.bottleneck_stage))
    rules = carried(gated, settings, domain(samples), run, options) | {"parity": PARITY if parity else None}
    data = assemble(measured, settings, gated.model, target, diag)
    data = finite(data | {"status": rules.pop("status"), "reason": rules.pop("reason")} | rules | design_of(run))
    if gated.model is not None and measured.packed is not None:  # scored, never fitted
        score = packed_forwards(gated.model, measured.packed, samples.bottleneck_stage, samples)
        data["packed_forwards"] = finite(score)
    policy = Policy.of(nested(with_load(data, options)))
    return policy, policy.report


def gate(
    samples: Samples, latency_model: str, parity: str | None, settings: ChunkSettings
) -> tuple[Gated, float | None, dict]:
    """(the model and its status, its target latency, the diagnostics) of the fit asked for, before the rules."""
    if latency_model not in LATENCY_MODEL_CHOICES:
        raise ValueError(f"--latency-model {latency_model} is unknown: use one of {', '.join(LATENCY_MODEL_CHOICES)}")
    if parity is not None:
        if parity != PARITY or latency_model != "quadratic":
            raise ValueError(
                f"--parity {parity} with --latency-model {latency_model}: parity is '{PARITY}' and needs "
                "--latency-model quadratic (the only model SGLang fits)"
            )
        model, reason, diag = sglang_fit(samples)
        diag.update({"requested_model": latency_model, "bottleneck_stage": samples.bottleneck_stage})
        target = None if model is None else model.target_ms(settings.base_chunk_size)
        return Gated(model, "dynamic" if model else "static", reason, parity=True), target, diag
    # The first timed request ran cold (no warm-up), and SGLang drops the first of its prefix-free probes: both go
    # (one row when the file starts with a prefix-free request, as `ppprof profile` writes it).
    used, dropped = without_warmup(samples)
    fitted, failed, per_model = fit_used_rows(used, latency_model)
    diag = {
        "requested_model": latency_model,
        "dropped_warmup_rows": [int(i) + 1 for i in dropped],
        "candidates": candidate_table(per_model, failed),
        "bottleneck_stage": samples.bottleneck_stage,
        "stage_totals_ms": samples.stage_totals_ms,
    }
    model, target, status, reason = select_and_gate(fitted, failed, per_model, diag, settings, latency_model, used)
    resampled = None
    if status == "dynamic":  # the interval over resamples that each choose their model again (auto), or refit it
        names = choice_set(fitted, used)[0] if latency_model == "auto" else [model.name]
        resampled = (*rechosen_refits(fitted, names, used, RESAMPLES, SEED), {n: fitted[n].model for n in names})
    return Gated(model, status, reason, resampled=resampled), target, diag


def with_load(policy: dict, options: PolicyOptions) -> dict:
    """The policy with its under-load rule (ppprof.serving.underload: chosen by simulating the serving scheduler on
    its planning model at closed-loop levels, options.async_depth slots beyond the stages) where one beats its idle
    rules under load, and what it was chosen on in its diagnostics (`under_load`); a parity policy (SGLang's own
    rule) is left as SGLang runs it. options.load_rule False (--no-load-rule): no under-load rule, and the
    diagnostics say it was not chosen."""
    if not options.load_rule:
        return policy | {"diagnostics": policy["diagnostics"] | {"under_load": {"skipped": "--no-load-rule"}}}
    if policy["latency_model"] is None or policy.get("parity") is not None:
        return policy
    load, evidence = choose_load(Policy.of(nested(policy)), options.async_depth)
    diagnostics = policy["diagnostics"] | {"under_load": evidence}
    return finite(policy | {"diagnostics": diagnostics} | ({"load": load} if load else {}))


def design_of(run: dict | None) -> dict:
    """How the samples were collected, as run.json records it ({} for a plain CSV or an older run)."""
    return {"design": (run or {})["design"]} if isinstance((run or {}).get("design"), dict) else {}


def assemble(
    measured: RunSamples, settings: ChunkSettings, model: LatencyModel | None, target: float | None, diag: dict
) -> dict:
    """The policy's fields of the fit: the model, the rule's settings, diagnostics, provenance and domain (the
    status, the reason and the rules follow, carried)."""
    prov = provenance(measured.run, measured.samples)
    prov.update(
        {"created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "ppprof_version": __version__}
    )
    return {
        "schema_version": SCHEMA_VERSION,
        "status": None,
        "reason": None,
        "latency_model": None if model is None else model.to_dict(),
        "settings": settings.to_dict(),
        "target_latency_ms": target,
        "target_chunk_latency_ms": None if model is None else model.c + target,
        "rule": RULE_TEXT,
        "diagnostics": diag,
        "provenance": prov,
        "domain": domain(measured.samples),
    }


def domain(samples: Samples) -> dict:
    """The prefix and chunk ranges the samples measured: where the latency model is interpolated, not extrapolated."""
    return {
        "prefix_len": [int(samples.prefix_len.min()), int(samples.prefix_len.max())],
        "chunk_size": [int(samples.chunk_size.min()), int(samples.chunk_size.max())],
        "prefix_lens": sorted(int(p) for p in set(samples.prefix_len.tolist())),
    }


def fit(samples_path: str | Path, out: str | Path | None = None, latency_model: str = "auto", **keywords):
    """`ppprof fit`: read the checkpoint files (the samples, and the run.json and packed.csv beside them where they
    exist) and fit them as `fit_and_save` does, its keywords passed on (plots, parity, policy_options, the rule's
    settings). Returns (path, policy document)."""
    return fit_and_save(RunSamples.read(samples_path), out, latency_model, **keywords)


def fit_and_save(
    measured: RunSamples,
    out: str | Path | None = None,
    latency_model: str = "auto",
    *,
    plots: bool = False,
    parity: str | None = None,
    policy_options: dict | None = None,
    **options,
) -> tuple[Path, dict]:
    """Fit `measured` (fit_samples) with the rule's settings and policy options of its run.json, the options given
    winning, and write the policy (default: policy.json beside the samples) and, with `plots`, its plots. Returns
    (path, policy document). The profile calls it on the samples it holds; nothing is read back."""
    where = measured.samples.path
    settings = resolve_settings(measured.run, where, **options)
    chosen = resolve_policy_options(measured.run, where, settings.context_len, **(policy_options or {}))
    policy = document(*fit_samples(measured, settings, chosen, latency_model, parity))
    path = save(Path(out) if out is not None else RunFolder.of(where).policy, policy)
    if plots:
        write_plots(measured.samples, policy, path.parent)
    return path, policy


def fit_run(run_dir: str | Path, *, load_rule: bool = True) -> Path:
    """Fit `run_dir/samples.csv` with the defaults of `run_dir/run.json` (scoring the model on `run_dir/packed.csv`
    where it exists), as the profile fits it; write `run_dir/policy.json`, `fit.png` (measured latency vs
    chunk_size with the fitted curve per prefix) and `chunks.png` (chunk size vs prefix_len).

    Signature: fit_run(run_dir: str | Path, *, load_rule: bool = True) -> Path of the policy written (load_rule
    False: no under-load rule, as `ppprof fit --no-load-rule`). Raises ValueError on unreadable input, before
    anything is written. A model that fails the quality gates still gives a (static) policy, not an error.
    """
    options = None if load_rule else {"load_rule": False}
    return fit(RunFolder(run_dir).samples, latency_model=PROFILE_LATENCY_MODEL, plots=True, policy_options=options)[0]


def rechoose(data: dict, model: LatencyModel, status: str = "dynamic", reason: str = "given") -> dict:
    """A policy document like `data` (of any version read) with another model (or status): its target and rules
    chosen again, as `ppprof fit` chooses them, on the same settings, domain, overhead, calibration, stages and
    workload; in schema 6's layout."""
    data = flattened(data) | {"schema_version": SCHEMA_VERSION}
    settings = ChunkSettings(**data["settings"])
    workload = data.get("workload")
    options = PolicyOptions(
        overhead_ms=data["overhead"]["ms_per_chunk"],
        pp_size=data.get("num_stages"),
        workload=Workload.from_dict(workload) if workload else None,
    )
    rules = carried(Gated(model, status, reason, data.get("calibration")), settings, data.get("domain"), None, options)
    target = None if model is None else model.target_ms(settings.base_chunk_size)
    # packed_forwards was scored, and load chosen, on the model this one replaces
    data = {k: v for k, v in data.items() if k not in ("packed_forwards", "load")}
    model_dict = None if model is None else model.to_dict()
    return nested(finite(dict(data, latency_model=model_dict, target_latency_ms=target, **rules)))
