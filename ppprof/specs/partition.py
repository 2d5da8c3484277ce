"""Split a model's layers across pipeline stages: evenly by default, or by an explicit partition such as 3,5."""

from __future__ import annotations

from collections.abc import Sequence


def split_layers(num_layers: int, pp_size: int, partition: Sequence[int] | None = None) -> list[range]:
    """Contiguous layer ranges, one per stage.

    Even split: the first `num_layers % pp_size` stages get one layer more. With `partition`, stage i gets
    partition[i] layers; the counts must be positive and add up to `num_layers`.
    """
    if pp_size < 1:
        raise ValueError(f"number of stages ({pp_size}) must be >= 1")
    if partition is None:
        if pp_size > num_layers:
            raise ValueError(
                f"number of stages ({pp_size}) cannot be greater than layers ({num_layers}): "
                "reduce --pp/--nproc-per-node or use more layers"
            )
        base, extra = divmod(num_layers, pp_size)
        counts = [base + (i < extra) for i in range(pp_size)]
    else:
        counts = [int(c) for c in partition]
        given = ",".join(map(str, counts))
        if len(counts) != pp_size:
            raise ValueError(
                f"--layer-partition {given} has {len(counts)} stages but the pipeline has {pp_size}: "
                f"give one count per stage"
            )
        if any(c < 1 for c in counts):
            raise ValueError(f"--layer-partition {given} would leave a stage empty: give every stage >= 1 layer")
        if sum(counts) != num_layers:
            raise ValueError(
                f"--layer-partition {given} adds up to {sum(counts)} layers but the model has {num_layers}: "
                "make the counts add up to the number of layers"
            )
    out, start = [], 0
    for c in counts:
        out.append(range(start, start + c))
        start += c
    return out


def parse_partition(text: str | None) -> list[int] | None:
    """'3,5' -> [3, 5]; None or '' -> None."""
    if not text:
        return None
    try:
        return [int(p) for p in str(text).split(",")]
    except ValueError:
        raise ValueError(
            f"--layer-partition {text!r} is not a comma-separated list of layer counts, e.g. 3,5"
        ) from None
