"""`ppprof calibrate`: refit a policy's latency model on a server's own forwards (forward traces) and print the drift
report (ppprof.fit.live)."""

from __future__ import annotations

import json

import click

from ppprof.fit.live import calibrate
from ppprof.fit.live_forwards import drift_text
from ppprof.fit.settings import LATENCY_MODEL_CHOICES
from ppprof.fit.summary import fit_summary


@click.command(
    "calibrate", epilog="Example: ppprof calibrate results/my-run/policy.json trace.jsonl -o calibrated.json"
)
@click.argument("policy", type=click.Path(dir_okay=False))
@click.argument("traces", metavar="TRACE...", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "-o", "--out", type=click.Path(dir_okay=False), default=None, help="New policy  [default: POLICY-calibrated.json]"
)
@click.option(
    "--latency-model",
    type=click.Choice(LATENCY_MODEL_CHOICES),
    default=None,
    help="The model to fit  [default: the one POLICY's fit asked for]",
)
@click.option("--json", "as_json", is_flag=True, help="Print the drift report as JSON.")
def calibrate_command(policy, traces, out, latency_model, as_json) -> None:
    """Refit POLICY's latency model on the live forwards of TRACE... (forward traces of one server, written with
    --forward-trace): single-request forwards as rows, packed batches through the packed-forward form, the profile's
    samples only where the live forwards leave a region uncovered; the same model choice, form check and status as
    `ppprof fit`. Writes the new policy atomically and prints the drift report: per stage and prefix band, the live
    median against the profiled and the calibrated predictions."""
    path, new, rows = calibrate(policy, traces, out, latency_model)
    if as_json:
        click.echo(
            json.dumps({"policy": str(path), "live": new["report"]["provenance"]["live"], "drift": rows}, indent=2)
        )
        return
    live = new["report"]["provenance"]["live"]
    click.echo(fit_summary(path, new))
    used = live["forwards_used"]
    dropped = ", ".join(f"{n} {why}" for why, n in live["forwards_dropped"].items()) or "none"
    click.echo(
        f"live forwards of stage {live['stage']}: {used['single']} single-request, {used['packed']} packed, over "
        f"{live['time_span_s']:.1f} s; {live['profile_rows']} profile rows fill the uncovered cells, at the live pace "
        f"{live['profile_pace']:.3f}; dropped: {dropped}"
    )
    names = {"profiled": "profiled"} | ({"calibrated": "calibrated"} if "calibrated_ms" in rows[0] else {})
    click.echo("drift (medians per stage and prefix band):")
    for line in drift_text(rows, names):
        click.echo("  " + line)
