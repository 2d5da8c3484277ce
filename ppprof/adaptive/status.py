"""The adaptive design's view of the decision the profile makes: the status the profile's own fit would write on the
samples so far (ppprof.fit.build.fit_samples, with the pipeline overhead and its calibration measured before the
probes, so on the planning model the fit will use), whether the resampled fits leave it sure, and the gradient of its
gain in the model's coefficients, so that the next batch probes where the decision is least sure. Pure numpy; no
torch.

Sure: a dynamic status is (its gain's lower bound, the LOWER_QUANTILE quantile of the resampled fits, clears
--min-gain); a static one when at most LOWER_QUANTILE of the resampled fits reach --min-gain (the same one-sided
90%, the other way). A static status from a failed check (the model's form or its condition number) carries no
interval and is not sure: more samples may bear the form out, or determine the coefficients."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ppprof.adaptive.uncertainty import FORM_TERMS, FULL_FORM, plan_gradient
from ppprof.config import PolicyOptions, ProfileConfig
from ppprof.config.workload import parse_prompt_spec
from ppprof.fit.build import PROFILE_LATENCY_MODEL, fit_samples
from ppprof.fit.confidence import LOWER_QUANTILE
from ppprof.fit.fitted import RunSamples
from ppprof.fit.samples import Samples
from ppprof.policy.builders import build_prompt_rule
from ppprof.policy.choice import rule_domain
from ppprof.policy.planners import chunk_latencies_ms, fixed_chunks, ttft_ms
from ppprof.policy.rule import LatencyModel
from ppprof.policy.tables import PromptRule

Z_LOWER = 1.2815515655446004
"""The standard normal's 1 - LOWER_QUANTILE quantile: a gain's interval bound lies this many standard deviations from
its median."""
GAIN_FLOOR = 0.002
"""The least distance between the gain and --min-gain a batch aims to resolve: a gain right at the threshold would
otherwise ask for endless samples (the request budget ends those)."""


@dataclass(slots=True)
class StatusCheck:
    """The status the profile's fit would write on the samples so far, and what the design needs of it."""

    status: str
    reason: str
    min_gain: float
    model: str | None = None
    """The model the fit chose; None where none fitted."""
    gain: float | None = None
    """The prompt-aware rule's predicted gain over the best fixed chunk; None where a check failed first."""
    interval: dict | None = None
    """predicted.gain_interval (ppprof.fit.confidence.gain_interval); None where a check failed first."""
    gradient: np.ndarray | None = None
    """d(gain)/d(coefficients), in FORM_TERMS order (every model is the full form with the terms it lacks at 0), the
    prompt-aware rule's plans and the best fixed chunk held (a static policy's prompt-aware rule built again, as its
    fit built it); None for a sure status or without an interval."""

    @property
    def sure(self) -> bool:
        if self.interval is None:
            return False
        if self.status == "dynamic":
            return self.interval["lower"] >= self.min_gain
        return self.interval["share_above_threshold"] <= LOWER_QUANTILE

    def tolerance(self) -> float:
        """The standard deviation of the gain at which the status would be sure: its distance from --min-gain
        (GAIN_FLOOR at least) over Z_LOWER."""
        return max(abs(self.gain - self.min_gain), GAIN_FLOOR) / Z_LOWER

    @property
    def model_shares(self) -> dict[str, float]:
        """{model: share of the resampled fits that chose it} (their choice made again in each); {} without."""
        return dict((self.interval or {}).get("models") or {})

    def spread(self) -> float:
        """The gain's standard deviation over the resampled fits, read from its interval."""
        return (self.interval["upper"] - self.interval["lower"]) / (2 * Z_LOWER)

    def to_dict(self) -> dict:
        """What a design step records of it."""
        i = self.interval or {}
        return {
            "status": self.status,
            "sure": self.sure,
            "gain": self.gain,
            "gain_lower": i.get("lower"),
            "gain_upper": i.get("upper"),
            "share_above_threshold": i.get("share_above_threshold"),
            "models": i.get("models"),
        }


def status_check(cfg: ProfileConfig, pp_size: int, samples: Samples, pipeline_overhead: dict | None) -> StatusCheck:
    """The status the profile's own fit (fit_run) would write on `samples`, the pipeline overhead measured before the
    probes (None: not measured) standing in for run.json's."""
    settings = cfg.chunk_settings()
    workload = None if cfg.fit.prompt_lens is None else parse_prompt_spec(cfg.fit.prompt_lens, settings.context_len)
    # The status and the rules only: the under-load rule (seconds of simulation) changes neither.
    options = PolicyOptions(workload=workload, min_gain=cfg.fit.min_gain, pp_size=pp_size, load_rule=False)
    # What run.json will say of them: its stages (pp_size; world_size counts the ranks, pp_size x tp_size).
    run = {"pp_size": pp_size, "pipeline_overhead": pipeline_overhead}
    fitted = fit_samples(RunSamples(samples, run), settings, options, PROFILE_LATENCY_MODEL)[0]
    policy, report = fitted.data, fitted.report
    predicted = report.predicted or {}
    chosen = (policy.get("latency_model") or {}).get("name")
    check = StatusCheck(policy["status"], policy["reason"], options.min_gain, chosen)
    if "gain_interval" not in predicted or policy.get("latency_model") is None:
        return check
    check.gain = float(predicted["gain_vs_fixed_best"])
    check.interval = predicted["gain_interval"]
    if check.sure:
        return check  # the design does not aim at a sure status's gain
    model = LatencyModel.from_dict(policy["latency_model"])
    calibration, overhead_ms = policy["calibration"], policy["overhead"]["ms_per_chunk"]
    planning = model.planning(calibration, overhead_ms)
    # A static policy carries the best fixed chunk: the gain is the prompt-aware rule's, built again.
    if policy["status"] == "static":
        rule, _ = build_prompt_rule(planning, rule_domain(settings, report.domain, options.extrapolate), pp_size)
    else:
        rule = PromptRule.from_dict(policy["prompt_table"])
    lengths, weights = report.workload["prompt_lens"], report.workload["weights"]
    plans = [rule.plan(int(n)) for n in lengths]
    fixed = [fixed_chunks(int(predicted["fixed_best_chunk"]), int(n)) for n in lengths]
    scale = float(calibration.get("linear_scale", 1.0))
    Tp, dTp = mean_ttft_gradient(model, planning, plans, weights, pp_size, scale)
    Tf, dTf = mean_ttft_gradient(model, planning, fixed, weights, pp_size, scale)
    check.gradient = -(dTp * Tf - Tp * dTf) / Tf**2  # gain = 1 - Tp / Tf
    return check


def mean_ttft_gradient(
    model: LatencyModel, planning: LatencyModel, plans: list[list[int]], weights, pp_size: int, scale: float
) -> tuple[float, np.ndarray]:
    """The weighted mean TTFT of `plans` on the planning model and its gradient in the full form's coefficients
    (FORM_TERMS order, whichever model `model` is; the calibration's linear_scale multiplies c and b), each plan's
    slowest chunk held."""
    factor = np.array([scale if t in ("c", "b") else 1.0 for t in FORM_TERMS])
    total, grad = 0.0, np.zeros(len(factor))
    for chunks, w in zip(plans, weights):
        t = chunk_latencies_ms(planning, chunks)
        total += w * ttft_ms(t, pp_size)
        grad += w * plan_gradient(FULL_FORM, chunks, t, pp_size, factor)
    return total, grad


def gain_need(check: StatusCheck, margin: float) -> float | None:
    """The factor by which the gain's variance must shrink for the status to be sure (`margin` of it), or None where
    the check has no gain to resolve (a failed check, or already sure)."""
    if check.gradient is None:  # status_check leaves it None for a sure status
        return None
    spread = check.spread()
    return margin * min(1.0, (check.tolerance() / spread) ** 2) if spread > 0 and math.isfinite(spread) else margin
