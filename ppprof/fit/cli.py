"""`ppprof fit` and `ppprof tune`: the click commands; the work is in ppprof.fit.build and ppprof.servers.tune (tune
reads the profile's samples for the servers' boot fits)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ppprof.checks import require_int
from ppprof.io import atomic_write_json
from ppprof.config import DEFAULT_CONTEXT_LEN, DEFAULT_SMOOTH_FACTOR
from ppprof.fit.settings import LATENCY_MODEL_CHOICES
from ppprof.policy.compare import DEFAULT_TOLERANCES
from ppprof.policy.planners import default_num_stages
from ppprof.policy.schema import load_policy
from ppprof.servers import DEFAULT_SERVER, SERVERS, ServerSetting, get
from ppprof.servers.sglang import PARITY
from ppprof.servers.tune import draw, tune
from ppprof.servers.workload import parse_prompt_spec


@click.command("fit", epilog="Example: ppprof fit results/my-run/samples.csv -o policy.json")
@click.argument("samples", type=click.Path(dir_okay=False))
@click.option("--latency-model", type=click.Choice(LATENCY_MODEL_CHOICES), default="auto", show_default=True,
              help="quadratic (SGLang), prefix (ATOM), pairs (prefix + h L x^2) or auto (best on held-out prefix bands).")
@click.option("--base-chunk-size", type=int, default=None, help="B; default from run.json (required without it).")
@click.option("--smooth-factor", type=float, default=None, help=f"s in (0, 1]  [default: {DEFAULT_SMOOTH_FACTOR:g}]")
@click.option("--page-size", type=int, default=None, help="KV page size; default from run.json, else 1.")
@click.option("--alignment", type=int, default=None, help="Chunk alignment  [default: max(page_size, 64)]")
@click.option("--min-chunk-size", type=int, default=None, help="Floor of a chunk  [default: B // 4]")
@click.option("--max-chunk-size", type=int, default=None,
              help="Cap of each chunk after the first (max prefill tokens; may be below B)  [default: B]")
@click.option("--context-len", type=int, default=None,
              help=f"Context length; default from run.json, else {DEFAULT_CONTEXT_LEN}.")
@click.option("-o", "--out", type=click.Path(dir_okay=False), default=None,
              help="Policy file  [default: policy.json beside SAMPLES]")
@click.option("--parity", type=click.Choice([PARITY]), default=None,
              help="With --latency-model quadratic: SGLang's own fit, nothing else (no trimming, no gates but a > 0).")
def fit_command(samples, latency_model, out, parity, **options) -> None:
    """Fit a latency model to SAMPLES (a CSV with prefix_len, chunk_size, latency_ms) and write a policy."""
    from ppprof.fit.build import fit
    from ppprof.fit.summary import summary

    for name in ("alignment", "min_chunk_size", "max_chunk_size"):
        if options[name] is not None:
            require_int(f"--{name.replace('_', '-')}", options[name], 1)
    path, policy = fit(samples, out, latency_model, parity=parity, **options)
    note = incomplete_run_note(samples)
    if note:
        click.echo(f"warning: {note}", err=True)
    click.echo(summary(path, policy))


@click.command("tune", epilog="Example: ppprof tune results/my-run/policy.json --prompt-lens 8192,32768,131072 --pp 4 "
                                "--server sglang")
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False))
@click.option("--prompt-lens", "spec", required=True, metavar="SPEC",
              help="Prompt lengths: a list (8192,32768; weights as 8192:3,32768:1) or a file (one a line, or a CSV "
                   "with a prompt_len column and an optional weight column; a trace's rows count once each).")
@click.option("--pp", "num_stages", type=int, default=None,
              help="Pipeline stages  [default: the policy's profiled stages, else 1]")
@click.option("--server", type=click.Choice(SERVERS), default=DEFAULT_SERVER, show_default=True,
              help="The server whose flags, boot fit and chunk rule are tuned.")
@click.option("--current", default=None, metavar="FLAGS",
              help="Your current flags in the server's syntax, as one string  [default: the server's defaults]")
@click.option("--boot-fit", type=click.Choice(["samples", "model"]), default=None,
              help="What SGLang's and vllm-ascend's boot fit is taken from: the profile's prefix-free samples (as the "
                   "server would fit them), or the policy's model  [default: samples where samples.csv is beside "
                   "the policy]")
@click.option("--extrapolate", is_flag=True,
              help="Search chunk sizes beyond the profiled ones (the latency model is extrapolated there).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (every setting's TTFT per prompt, and its plans).")
@click.option("--png", type=click.Path(dir_okay=False), default=None,
              help="Plot of TTFT versus base chunk and smoothing factor  [default: <policy>.tune-<server>.png "
                   "beside the policy]")
def tune_command(policy_path, spec, num_stages, server, current, boot_fit, extrapolate, as_json, png) -> None:
    """Recommend server flags (base chunk, smoothing factor, floor or cap) that minimise the predicted TTFT of your
    prompt lengths, as that server would chunk them; compare with your current flags, the best fixed chunk and the
    DP-optimal bound."""
    from ppprof.fit.samples import read_samples

    policy = load_policy(policy_path)
    workload = parse_prompt_spec(spec, policy.settings.context_len)
    num_stages = default_num_stages(policy) if num_stages is None else num_stages
    samples = Path(policy_path).parent / "samples.csv"
    if boot_fit == "samples" and not samples.is_file():
        raise ValueError(f"--boot-fit samples needs {samples}: give the policy of a run folder, or --boot-fit model")
    forwards = None
    if boot_fit != "model" and samples.is_file() and get(server).fits_at_boot:
        forwards = read_samples(samples)
    result = tune(policy, workload, num_stages, server, current, extrapolate, forwards)
    path = Path(policy_path)
    png = Path(png) if png else path.with_name(f"{path.stem}.tune-{server}.png")
    draw(result, png, f"{path.name}: {get(server).label}, {num_stages} stages, {len(workload.prompt_lens)} prompt "
                      f"lengths")
    result["png"] = str(png)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for note in result["notes"]:
        click.echo(f"note: {note}", err=True)
    echo_tune(result, path)


def echo_tune(result: dict, path: Path) -> None:
    """The recommendation, then predicted TTFT per prompt length for each setting and the DP bound."""
    server = get(result["server"])
    label = server.label
    click.echo(f"policy {path} ({result['latency_model']} model), {label}, {result['num_stages']} stages")
    click.echo(f"recommended {label} flags:")
    click.echo(f"  {result['recommended']['command']}")
    settings = result["settings"]
    names = list(settings) + ["optimal"]
    click.echo("predicted TTFT (ms):")
    click.echo(f"  {'prompt_len':>10} {'weight':>6} " + " ".join(f"{n:>14}" for n in names))
    optimal = result["optimal"]["per_prompt"]
    for i, (n, w) in enumerate(zip(result["workload"]["prompt_lens"], result["workload"]["weights"])):
        cells = [settings[k]["per_prompt"][i]["ttft_ms"] for k in settings] + [optimal[i]["ttft_ms"]]
        click.echo(f"  {n:>10} {w:>6.3f} " + " ".join(f"{c:>14.2f}" for c in cells))
    for key, name in (("mean_ttft_ms", "mean"), ("p90_ttft_ms", "p90")):
        cells = [settings[k][key] for k in settings] + [result["optimal"][key]]
        click.echo(f"  {name:>10} {'':>6} " + " ".join(f"{c:>14.2f}" for c in cells))
    for k in settings:
        s = settings[k]["setting"]
        mode = (f"dynamic, B {s['base_chunk_size']}, s {s['smooth_factor']:g}, floor {s['min_chunk_size']}, "
                f"cap {s['max_chunk_size']}") if s["dynamic"] else \
            f"fixed {server.fixed_chunk_size(ServerSetting.from_dict(s))}"
        click.echo(f"  {k}: {mode}")
    gain = result["gain"]
    click.echo(f"recommended vs {list(settings)[0]}: {gain['vs_current']:+.1%} mean TTFT saved; vs the policy's "
               f"settings {gain['vs_policy']:+.1%}; vs the best fixed chunk {gain['vs_best_fixed']:+.1%}; "
               f"{result['gap_to_optimal']:.1%} above the DP-optimal bound")
    click.echo(f"plot: {result['png']}")


@click.command("compare", epilog="Example: ppprof compare results/baseline results/my-run --plot compare.png")
@click.argument("baseline", type=click.Path())
@click.argument("candidate", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the whole comparison as JSON.")
@click.option("--tolerance", "tolerances", multiple=True, metavar="NAME=VALUE",
              help="Override a tolerance (repeat, or separate with commas); NAME [default]: " + ", ".join(
                  f"{k} [{'none' if v == float('inf') else f'{v:g}'}]" for k, v in DEFAULT_TOLERANCES.items())
              + ". Values are fractions (0.1), percentages (10%) or none.")
@click.option("--prompt-len", "prompt_lens", type=int, multiple=True,
              help="Prompt length whose predicted TTFT is compared (repeat)  [default: 4, 16 and 64 x B]")
@click.option("--pp", "num_stages", type=int, default=None,
              help="Pipeline stages of the predicted TTFT  [default: the baseline's profiled stages]")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="PNG of both chunk-size tables and both latency models.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Also write the JSON comparison to this file (written even when the policy drifted).")
def compare_command(baseline, candidate, as_json, tolerances, prompt_lens, num_stages, plot, out) -> None:
    """Compare CANDIDATE with BASELINE (run folders or policy files): coefficients, target, chunk-size table,
    predicted TTFT, status and, for run folders, the samples. Exit 0 within tolerance, 1 on drift, 2 on bad input."""
    import json
    import sys

    from ppprof.fit.compare import compare
    from ppprof.policy.compare import parse_tolerances, render

    for n in prompt_lens:
        require_int("--prompt-len", n, 1)
    report = compare(baseline, candidate, parse_tolerances(tolerances), prompt_lens=sorted(set(prompt_lens)) or None,
                     num_stages=num_stages, plot=plot)
    if out:
        atomic_write_json(out, report)
    click.echo(json.dumps(report, indent=2) if as_json else render(report))
    if report["drifted"]:
        sys.exit(1)


def incomplete_run_note(samples_path: str) -> str | None:
    """One line when the run that wrote SAMPLES did not complete (run.json's status): what the fit stands on."""
    import pandas as pd

    from ppprof.fit.samples import read_run
    from ppprof.runfiles import COMPLETE

    run = read_run(samples_path)
    if run is None or run["status"] == COMPLETE:
        return None
    frame = pd.read_csv(samples_path)
    probes = frame["probe"].nunique() if "probe" in frame.columns else None
    total = run.get("num_probes")
    kept = f"the {len(frame)} samples of {probes} of {total} probes" if probes and total else f"its {len(frame)} samples"
    return (f"the run in {Path(samples_path).parent} is {run['status']} (run.json), not complete: fitted {kept}; "
            f"`ppprof profile --resume {Path(samples_path).parent}` finishes it")
