"""Checks of user input shared by every layer (pure; imports nothing)."""

from __future__ import annotations


def is_int(value) -> bool:
    """An integer and not a bool (bool is an int subclass in Python, so True would pass for 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def require_int(label: str, value, low: int) -> int:
    """`value` if it is an integer >= low, else ValueError naming `label` (e.g. "--page-size"), the value and the fix."""
    if not is_int(value) or value < low:
        raise ValueError(f"{label} {value!r} must be an integer >= {low}")
    return value
