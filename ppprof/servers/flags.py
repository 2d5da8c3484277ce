"""A server's command line, read and written: the flags of a `--current` command line (the last of a repeated flag
winning), their numbers checked in one line naming the flag, and an environment plus arguments quoted for a shell."""

from __future__ import annotations

import math
import shlex

CALIBRATION = "calibration"
"""The key a flag's parsed value is returned under when it is a latency model, not a setting (ATOM's calibration)."""
DYNAMIC = "dynamic"
"""The setting a bare flag (no value) turns on."""


def command_line(env: dict, args: list[str]) -> str:
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(a) for a in args])


def split_command(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as e:
        raise ValueError(f"--current {text!r} is not a command line ({e}): quote it as one shell string") from None


def read_flags(tokens: list[str], keys: dict[str, str]) -> tuple[dict[str, tuple[str, str | None]], list[str]]:
    """({key: (flag, value)} of the flags in `keys` (a DYNAMIC flag takes no value), the tokens ignored); the last
    of a repeated flag wins."""
    values: dict[str, tuple[str, str | None]] = {}
    ignored: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, inline = token.partition("=")
        if name not in keys:
            ignored.append(token)
        elif keys[name] == DYNAMIC:
            values[DYNAMIC] = (name, None)
        elif eq:
            values[keys[name]] = (name, inline)
        elif i + 1 < len(tokens):
            values[keys[name]] = (name, tokens[i + 1])
            i += 1
        else:
            raise ValueError(f"--current: {name} has no value: give one, e.g. {name} 8192")
        i += 1
    return values, ignored


def parse_number(name: str, value: str, kind, low, high=None, low_open=False):
    """`value` of flag `name` as `kind` (int or float) in [low, high] (low excluded with `low_open`); ValueError
    (one line) naming the flag otherwise."""
    try:
        number = kind(value)
    except ValueError:
        raise ValueError(
            f"--current: {name} {value!r} is not {'an integer' if kind is int else 'a number'}: give one"
        ) from None
    if (
        not math.isfinite(number)
        or (number <= low if low_open else number < low)
        or (high is not None and number > high)
    ):
        bound = f"in ({low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"--current: {name} {value} is out of range: use a value {bound}")
    return number
