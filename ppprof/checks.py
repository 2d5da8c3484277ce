"""Checks of user input shared by every layer (pure; imports nothing)."""

from __future__ import annotations


def is_int(value) -> bool:
    """An integer and not a bool (bool is an int subclass in Python, so True would pass for 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An int or a float and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def require_int(label: str, value, low: int, high: int | None = None) -> int:
    """`value` if it is an integer in low..high (high None: no upper bound), else ValueError naming `label` (e.g.
    "--page-size"), the value and the fix. A float (4096.0 too), a string, a bool or a list is not an integer."""
    if not is_int(value):
        raise ValueError(f"{label} {short(value)} must be an integer{range_text(low, high)}, not {a_type(value)}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{label} {value} must be an integer{range_text(low, high)}")
    return value


def require_bool(label: str, value) -> bool:
    """`value` if it is a bool, else ValueError (a YAML string "false" is not false)."""
    if not isinstance(value, bool):
        raise ValueError(
            f"{label} {short(value)} must be true or false (an unquoted YAML boolean), not {a_type(value)}"
        )
    return value


def require_str(label: str, value, what: str = "a string") -> str:
    """`value` if it is a non-empty string, else ValueError (`what` says what the string is, e.g. "a folder path")."""
    if not isinstance(value, str) or not value:
        raise ValueError(
            f"{label} {short(value)} must be {what}"
            + (f", not {a_type(value)} (quote it in YAML)" if not isinstance(value, str) else "")
        )
    return value


def a_type(value) -> str:
    """'an int', 'a float', 'a str', 'a list': the type of a value, with its article, for messages."""
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def range_text(low: int, high: int | None) -> str:
    return f" >= {low}" if high is None else f" in {low}..{high}"


def short(value, limit: int = 60) -> str:
    """repr(value), cut to `limit` characters, so that a message stays one short line whatever the input."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
