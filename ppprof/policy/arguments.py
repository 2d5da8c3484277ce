"""The checks of what a caller passes a loaded policy: a token count is an integer, and a prompt stays within the
policy's context and a bounded plan."""

from __future__ import annotations

import numbers

from ppprof.checks import short

MAX_PLAN_CHUNKS = 1_000_000
"""The most chunks a plan holds (Policy.plan, `ppprof plan`): its lists stay a few MB whatever the prompt."""


def token_count(name: str, value) -> int:
    """`value` as a Python int if it is an integer (a Python or numpy int); TypeError for anything else (a float, NaN
    and inf too, a bool, a string, None): a token count is never fractional, and a silent int() would hide a bug."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise TypeError(
        f"{name} must be an integer (a Python or numpy int) number of tokens, got {type(value).__name__} {short(value)}"
    )


def check_prompt_len(prompt_len: int, context_len: int, smallest_chunk: int) -> None:
    """ValueError when a prompt is longer than the policy's context length (its tables end there), or could take
    more than MAX_PLAN_CHUNKS chunks of its smallest."""
    if prompt_len > context_len:
        raise ValueError(
            f"--prompt-len {prompt_len} exceeds the policy's context_len {context_len}: no prompt is "
            f"longer than the model's context; use a prompt of at most {context_len} tokens or a policy "
            "profiled with a larger --context-len"
        )
    if prompt_len > smallest_chunk * MAX_PLAN_CHUNKS:
        raise ValueError(
            f"--prompt-len {prompt_len} could take {-(-prompt_len // smallest_chunk)} chunks of the policy's "
            f"smallest, {smallest_chunk} tokens: a plan holds at most {MAX_PLAN_CHUNKS}; use a prompt of at "
            f"most {smallest_chunk * MAX_PLAN_CHUNKS} tokens"
        )


def checked_prompt_len(prompt_len, context_len: int, smallest_chunk: int) -> int:
    """A prompt length to plan: an integer (token_count), positive, and within check_prompt_len."""
    prompt_len = token_count("prompt_len", prompt_len)
    if prompt_len < 1:
        raise ValueError(f"--prompt-len {prompt_len} is invalid: use a positive number of tokens")
    check_prompt_len(prompt_len, context_len, smallest_chunk)
    return prompt_len
