"""policy.json written through the one check `load` reads it by (ppprof.policy.runtime.from_text on the text
written), and a loaded policy's deep check in one line; reading lives with the Policy it builds."""

from __future__ import annotations

import json
from pathlib import Path

from ppprof.io import atomic_write_text
from ppprof.policy.rebuilt import check_rules
from ppprof.policy.runtime import Policy, from_dict, from_text, load
from ppprof.policy.summary import summary_line

__all__ = ["from_dict", "from_text", "load", "save", "validate"]


def save(path: str | Path, data: dict) -> Path:
    """Write a policy atomically, checked first as `load` checks what it reads (from_text on the text written)."""
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    from_text(text, f"policy {path}")
    return atomic_write_text(path, text)


def validate(policy: Policy) -> str:
    """Deep sanity check (check_rules); returns a one-line summary or raises ValueError with the reason."""
    check_rules(policy)
    return summary_line(policy)
