"""`ppprof tune`: the server flags with the least predicted TTFT over a workload (ppprof.servers.tune), read from the
policy and, for the servers' boot fits, the profile's samples beside it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import click

from ppprof.commands.options import with_options
from ppprof.config.workload import parse_prompt_spec
from ppprof.fit.samples import read_samples
from ppprof.policy.planners import default_pp_size
from ppprof.policy.policy_file import load
from ppprof.runfiles import RunFolder
from ppprof.servers import DEFAULT_SERVER, SERVERS, ServerSetting, get
from ppprof.servers.tune import draw, tune
from ppprof.servers.tuner import Tuner
from ppprof.serving.levels import parse_levels
from ppprof.serving.tuning import load_scorer, policy_load_figures

TUNE_OPTIONS = (
    (
        ("--prompt-lens", "spec"),
        dict(required=True, metavar="SPEC"),
        "Prompt lengths: a list (8192,32768; weights as 8192:3,32768:1) or a file (one a line, or a CSV "
        "with a prompt_len column and an optional weight column; a trace's rows count once each).",
    ),
    (
        ("--pp-size", "--pp", "pp_size"),
        dict(type=int, default=None),
        "Pipeline stages  [default: the policy's profiled stages, else 1]",
    ),
    (
        ("--server",),
        dict(type=click.Choice(SERVERS), default=DEFAULT_SERVER, show_default=True),
        "The server whose flags, boot fit and chunk rule are tuned.",
    ),
    (
        ("--current",),
        dict(default=None, metavar="FLAGS"),
        "Your current flags in the server's syntax, as one string  [default: the server's defaults]",
    ),
    (
        ("--boot-fit",),
        dict(type=click.Choice(["samples", "model"]), default=None),
        "What SGLang's and vllm-ascend's boot fit is taken from: the profile's prefix-free samples (as the "
        "server would fit them), or the policy's model  [default: samples where samples.csv is beside "
        "the policy]",
    ),
    (
        ("--extrapolate",),
        dict(is_flag=True),
        "Search chunk sizes beyond the profiled ones (the latency model is extrapolated there).",
    ),
    (
        ("--concurrency",),
        dict(default=None, metavar="LIST"),
        "Score every setting under load as well: closed loops of this many requests in flight (e.g. 4,16), served "
        "in the serving simulation; the search then minimises the geometric mean of the mean TTFT alone and at "
        "each level  [default: alone only]",
    ),
    (("--json", "as_json"), dict(is_flag=True), "Print JSON (every setting's TTFT per prompt, and its plans)."),
    (
        ("--png",),
        dict(type=click.Path(dir_okay=False), default=None),
        "Plot of TTFT versus base chunk and smoothing factor  [default: <policy>.tune-<server>.png beside the policy]",
    ),
)
"""The options of `ppprof tune`, in the order --help shows them."""


@dataclass(frozen=True, slots=True)
class TuneOptions:
    """`ppprof tune`'s options (TUNE_OPTIONS) as click hands them, in one value."""

    spec: str
    pp_size: int | None
    server: str
    current: str | None
    """The prompt lengths (SPEC), the stages, the server tuned and the user's flags in its syntax."""
    boot_fit: str | None
    extrapolate: bool
    concurrency: str | None
    """What the server's boot fit is taken from, chunks beyond the profiled ones, the closed loops scored."""
    as_json: bool
    png: str | None
    """JSON or the text table, and the plot's path."""


@click.command(
    "tune",
    epilog="Example: ppprof tune results/my-run/policy.json --prompt-lens 8192,32768,131072 --pp 4 --server sglang",
)
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False))
@with_options(*TUNE_OPTIONS)
def tune_command(policy_path, **options) -> None:
    """Recommend server flags (base chunk, smoothing factor, floor or cap) that minimise the predicted TTFT of your
    prompt lengths, as that server would chunk them; compare with your current flags, the best fixed chunk and the
    DP-optimal bound."""
    opts = TuneOptions(**options)
    spec, server, boot_fit, concurrency = opts.spec, opts.server, opts.boot_fit, opts.concurrency
    policy = load(policy_path)
    workload = parse_prompt_spec(spec, policy.settings.context_len)
    pp_size = default_pp_size(policy) if opts.pp_size is None else opts.pp_size
    samples = RunFolder.of(policy_path).samples
    if boot_fit == "samples" and not samples.is_file():
        raise ValueError(f"--boot-fit samples needs {samples}: give the policy of a run folder, or --boot-fit model")
    forwards = None
    if boot_fit != "model" and samples.is_file() and get(server).fits_at_boot:
        forwards = read_samples(samples)
    load_score = None
    if concurrency is not None:
        levels = [level.concurrency for level in parse_levels(concurrency, None)]
        load_score = load_scorer(policy, workload, pp_size, levels)
    tuner = Tuner(
        policy, workload, pp_size, server, extrapolate=opts.extrapolate, forwards=forwards, load_score=load_score
    )
    result = tune(tuner, opts.current)
    if concurrency is not None:
        result["policy_load"] = policy_load_figures(policy, workload, pp_size, levels)
    path = Path(policy_path)
    png = Path(opts.png) if opts.png else path.with_name(f"{path.stem}.tune-{server}.png")
    draw(result, png, f"{path.name}: {get(server).label}, {pp_size} stages, {len(workload.prompt_lens)} prompt lengths")
    result["png"] = str(png)
    if opts.as_json:
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
        mode = (
            (
                f"dynamic, B {s['base_chunk_size']}, s {s['smooth_factor']:g}, floor {s['min_chunk_size']}, "
                f"cap {s['max_chunk_size']}"
            )
            if s["dynamic"]
            else f"fixed {server.fixed_chunk_size(ServerSetting.from_dict(s))}"
        )
        click.echo(f"  {k}: {mode}")
    echo_load(settings, result.get("policy_load"))
    gain = result["gain"]
    click.echo(
        f"recommended vs {list(settings)[0]}: {gain['vs_current']:+.1%} mean TTFT saved; vs the policy's "
        f"settings {gain['vs_policy']:+.1%}; vs the best fixed chunk {gain['vs_best_fixed']:+.1%}; "
        f"{result['gap_to_optimal']:.1%} above the DP-optimal bound"
    )
    if "objective_gain" in result:
        gains = ", ".join(f"{k[3:]} {v:+.1%}" for k, v in result["objective_gain"].items() if k != "vs_recommended")
        click.echo(f"recommended under load and alone (geometric mean of mean TTFTs), saved vs: {gains}")
    click.echo(f"plot: {result['png']}")


def echo_load(settings: dict, policy_load: dict | None = None) -> None:
    """With --concurrency: each setting's throughput and mean / p90 TTFT at each level, simulated, and ppprof's own
    sizer's (policy-load: the policy file in SGLang through ppprof's sizer, its under-load rule included)."""
    first = next(iter(settings.values()))
    if "load" not in first:
        return
    click.echo("under load (serving simulation): throughput tokens/s, mean / p90 TTFT ms")
    for level in first["load"]:
        cells = [(k, settings[k]["load"][level]) for k in settings]
        cells += [("policy-load", policy_load[level])] if policy_load else []
        click.echo(
            f"  {level:>16} "
            + " ".join(
                f"{k}: {c['throughput_tokens_per_s']:.0f}, {c['ttft_mean_ms']:.1f} / {c['ttft_p90_ms']:.1f};"
                for k, c in cells
            )
        )
