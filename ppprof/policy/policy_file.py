"""policy.json read and written through one check: `load` and `save` both take a policy only as `from_dict` takes it
(the structure, the numbers' bounds, the tables rebuilt from the rules), on the strict JSON text of the file."""

from __future__ import annotations

import json
from pathlib import Path

from ppprof.io import TooDeep, atomic_write_text, parse_json, read_small_text
from ppprof.policy.rebuilt import check_rules
from ppprof.policy.runtime import Policy
from ppprof.policy.structure import check_structure
from ppprof.policy.summary import summary_line


def from_dict(data) -> Policy:
    """A Policy from a parsed policy file, checked as `ppprof validate` checks it (check_structure, check_rules);
    ValueError (one line) otherwise."""
    check_structure(data)
    policy = Policy.of(data)
    check_rules(policy)
    return policy


def from_text(text: str, label: str) -> Policy:
    """The Policy of a policy file's text, checked as from_dict checks it, after a strict JSON parse (no NaN or
    Infinity, bounded nesting); ValueError with one line starting with `label` otherwise. Both load and save call it."""
    try:
        data = parse_json(text, label, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"{label} is not readable JSON ({e})") from None
    except TooDeep:
        raise
    except ValueError as e:
        raise ValueError(f"{label} is not strict JSON: {e}; regenerate it with `ppprof fit`") from None
    try:
        return from_dict(data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{label}: {e}") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def load(path: str | Path) -> Policy:
    """Read a policy file and check it as `ppprof validate` does; ValueError with one line naming the file and the
    field if it is missing, not strict JSON or not a valid policy. Every command that reads a policy calls this, and
    servers call it as `ppprof.policy.load(path)`."""
    path = Path(path)
    try:
        text = read_small_text(path, "policy file", "give a policy.json written by `ppprof fit`")
    except FileNotFoundError:
        raise ValueError(f"policy file {path} does not exist: run `ppprof fit` first") from None
    except IsADirectoryError:
        raise ValueError(f"policy file {path} is a folder: give the policy.json in it") from None
    except OSError as e:
        raise ValueError(f"policy file {path} is not readable ({e.strerror})") from None
    return from_text(text, f"policy file {path}")


def save(path: str | Path, data: dict) -> Path:
    """Write a policy atomically, checked first as `load` checks what it reads (from_text on the text written)."""
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    from_text(text, f"policy {path}")
    return atomic_write_text(path, text)


def validate(policy: Policy) -> str:
    """Deep sanity check (check_rules); returns a one-line summary or raises ValueError with the reason."""
    check_rules(policy)
    return summary_line(policy)
