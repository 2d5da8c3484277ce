"""matplotlib set-up shared by every plot ppprof draws: the Agg backend (no display needed), imported only where a
plot is drawn, and atomic PNG output."""

from __future__ import annotations

from pathlib import Path

from ppprof.io import atomic_write


def pyplot():
    """matplotlib.pyplot with the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 110, **savefig_kwargs) -> Path:
    """Write `fig` as a PNG at `path` atomically, then close it."""
    try:
        return atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=dpi, **savefig_kwargs))
    finally:
        pyplot().close(fig)
