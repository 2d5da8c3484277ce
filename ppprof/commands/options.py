"""Click options more than one command takes, their defaults shown from the settings tree (ppprof.config), so that a
help text never states a default of its own."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import click

from ppprof.bounds import ATTENTION_BACKENDS, DEVICES
from ppprof.config import PolicyOptions, ProfileConfig, flag
from ppprof.config.sections import setting_fields
from ppprof.distributed.launch import TORCHRUN_OPTIONS
from ppprof.run.job import RESOLVED_CONFIG
from ppprof.run.rank import VERBOSE_ENV

resolved_config_option = click.option(
    RESOLVED_CONFIG, hidden=True, help="Internal: the launcher hands each rank the resolved settings."
)


def shown(name: str, when_none: str | None = None, settings=ProfileConfig) -> str:
    """The default of setting `name` (of `settings`, a class of ppprof.config) as help shows it: "[512]", "[--fit]"
    for a flag, `when_none` in brackets where the default is None (resolved from other settings)."""
    every = setting_fields() if settings is ProfileConfig else dataclasses.fields(settings)
    value = {f.name: f.default for f in every}[name]
    if value is None:
        return f"[{when_none}]" if when_none else ""
    if isinstance(value, bool):
        return f"[{flag(name) if value else '--no-' + flag(name)[2:]}]"
    return f"[{value:g}]" if isinstance(value, float) else f"[{value}]"


timeout_option = click.option(
    "--timeout",
    type=float,
    help='Seconds a rank waits on another at least before the run stops with "rank N did '
    f'not answer"; more where requests are slow (20 x the slowest so far). {shown("timeout")}',
)

forward_trace_option = click.option(
    "--forward-trace",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write every stage's forwards to this forward trace (docs/forwards.md; `ppprof calibrate` reads it).",
)


def set_verbose(ctx, param, value) -> None:
    if value:  # the ranks the launcher starts inherit its environment; a rank started by torchrun reads its own
        os.environ[VERBOSE_ENV] = "1"


verbose_option = click.option(
    "--verbose",
    is_flag=True,
    default=False,
    expose_value=False,
    callback=set_verbose,
    help="Every rank's log lines on the console, not only rank 0's and each rank's own.",
)


def taken(cls, options: dict):
    """A command's options value: dataclass `cls` made of its fields, taken out of click's keyword `options` (what
    is left there is the options of another settings object, or of torchrun)."""
    return cls(**{f.name: options.pop(f.name) for f in dataclasses.fields(cls)})


Option = tuple[tuple[str, ...], dict, str]
"""One click option as data: (its declarations, click.option's other keywords, its help)."""


def with_options(*entries: Option | Callable) -> Callable:
    """A decorator that adds `entries` to a command in the order given, as decorators stacked in that order would
    (the first one first in --help): each an Option, or a decorator that adds options (a shared one, a group)."""

    def add(f):
        for entry in reversed(entries):
            f = entry(f) if callable(entry) else click.option(*entry[0], help=entry[2], **entry[1])(f)
        return f

    return add


TORCHRUN_PARAMS = frozenset(name for name, _ in TORCHRUN_OPTIONS)
"""The parameter names of torchrun's options: advanced on every command that takes them."""


class TieredCommand(click.Command):
    """A command whose --help shows the settings a user chooses; the `advanced` ones (measurement internals, torchrun's
    options, what tests shrink a run with) work the same but are listed only by --help-all, in a section of their
    own. Most of them are settings of the YAML config too (`--config`)."""

    def __init__(self, *args, advanced=frozenset(), **kwargs):
        super().__init__(*args, **kwargs)
        self.advanced = frozenset(advanced)
        unknown = self.advanced - {p.name for p in self.params}
        assert not unknown, f"advanced options that {self.name} does not take: {sorted(unknown)}"
        self.params.append(
            click.Option(
                ["--help-all"],
                is_flag=True,
                expose_value=False,
                is_eager=True,
                callback=self.show_all,
                help="Show the advanced options too, and exit.",
            )
        )

    def show_all(self, ctx, param, value) -> None:
        if value and not ctx.resilient_parsing:
            ctx.meta["ppprof.help_all"] = True
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit()

    def format_options(self, ctx, formatter) -> None:
        basic, advanced = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                (advanced if param.name in self.advanced else basic).append(record)
        with formatter.section("Options"):
            formatter.write_dl(basic)
        if not advanced:
            return
        if ctx.meta.get("ppprof.help_all"):
            with formatter.section("Advanced options"):
                formatter.write_dl(advanced)
        else:
            formatter.write_paragraph()
            formatter.write_text(f"{len(advanced)} advanced options (measurement, torchrun's): --help-all lists them.")


def torchrun_options(f):
    """Add torchrun's options (passed to the launcher unchanged) to a command."""
    for name, takes_value in reversed(TORCHRUN_OPTIONS):
        option = flag(name)
        if takes_value:
            f = click.option(option, name, default=None, help=f"torchrun's {option}.")(f)
        else:
            f = click.option(option, name, is_flag=True, default=False, help=f"torchrun's {option}.")(f)
    return f


SIZING_OPTIONS = (
    (("--config", "config_path"), dict(type=click.Path(dir_okay=False)), "YAML file of settings (flags win)."),
    (("--device",), dict(type=click.Choice(DEVICES)), f"cpu (gloo) or cuda (NCCL). {shown('device')}"),
    (
        ("--base-chunk-size",),
        dict(type=int),
        f"Base chunk B; the sweep runs from 1.25 B down to ~B/128. {shown('base_chunk_size')}",
    ),
    (
        ("--requests-per-probe",),
        dict(type=int),
        f"Synthetic prefill requests per probe, 8..128. {shown('requests_per_probe')}",
    ),
    (("--page-size",), dict(type=int), f"KV cache page size in tokens. {shown('page_size')}"),
    (
        ("--max-probe-chunk-multiple",),
        dict(type=float),
        f"Largest probe chunk in multiples of B, 1.25..16 (1.25: SGLang's range only). "
        f"{shown('max_probe_chunk_multiple')}",
    ),
    (("--max-mamba-cache-size",), dict(type=int), f"Mamba state slots per stage. {shown('max_mamba_cache_size')}"),
    (("--max-running-requests",), dict(type=int), f"Request pool entries per stage. {shown('max_running_requests')}"),
    (
        ("--max-total-tokens",),
        dict(type=int),
        f"KV cache slots per stage. {shown('max_total_tokens', 'the longest probe request')}",
    ),
    (("--context-len",), dict(type=int), f"Context length of the served model. {shown('context_len')}"),
    (
        ("--prefix-lens",),
        dict(),
        f"Prefix lengths of the prefix probes, e.g. 512,1024,2048. {shown('prefix_lens', 'log-spaced, B..context')}",
    ),
    (
        ("--attention-backend",),
        dict(type=click.Choice(ATTENTION_BACKENDS)),
        f"auto (flashinfer on CUDA when installed, else sdpa), sdpa, flashinfer or reference. "
        f"{shown('attention_backend')}",
    ),
)
"""The options of `ppprof profile` that size what a stage holds; `ppprof model --memory` takes the same ones, so
that both resolve one ProfileConfig alike."""


def option_name(decls: tuple[str, ...]) -> str:
    """The parameter name click gives an option: its second declaration, else its flag in snake case."""
    return decls[1] if len(decls) > 1 else decls[0].lstrip("-").replace("-", "_")


sizing_options = with_options(*SIZING_OPTIONS)
"""Add SIZING_OPTIONS to a command."""


def policy_options(f):
    """Add the options the policy's rules are chosen with (ppprof.config.PolicyOptions) to `ppprof fit`."""
    opts = [
        click.option(
            "--prompt-lens",
            default=None,
            help="Workload the history-only table and the status are chosen on: lengths (8192:3,32768:1) "
            "or a file, as `ppprof tune` takes them. [default: log-spaced, B..the profiled domain]",
        ),
        click.option(
            "--min-gain",
            type=float,
            default=None,
            help="Least predicted gain of the prompt-aware rule over the best fixed chunk for a dynamic "
            f"policy. {shown('min_gain', settings=PolicyOptions)}",
        ),
        click.option(
            "--overhead-ms",
            type=float,
            default=None,
            help="Per-chunk pipeline overhead in ms. [default: the profile's measured one, else 0]",
        ),
        click.option(
            "--pp-size",
            "--pp",
            "pp_size",
            type=int,
            default=None,
            help="Pipeline stages the rules are chosen for. [default: the profile's]",
        ),
        click.option(
            "--extrapolate",
            is_flag=True,
            default=False,
            help="Let the rules plan chunks (up to 4 B) and prompts (up to the context) beyond the profiled domain.",
        ),
        click.option(
            "--async-depth",
            type=int,
            default=None,
            help="Micro-batch slots your server keeps in flight beyond the stages (SGLang's "
            "--pp-async-batch-depth), which the under-load rule is chosen at. [default: 0, SGLang's default]",
        ),
        click.option(
            "--load-rule/--no-load-rule",
            default=None,
            help="Choose the under-load rule by simulating your server's scheduler (seconds); --no-load-rule: the "
            "same chunks at every load. [default: --load-rule]",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f
