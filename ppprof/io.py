"""Atomic file output: every file ppprof writes appears whole or not at all; and strict JSON (`finite`)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp_path)` on a temporary file beside `path`, then rename it over `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:  # name the file the caller asked for, not the temporary one
        raise OSError(e.errno, e.strerror, str(path)) from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        os.replace(tmp_path, path)
    except OSError as e:  # disk full, permission: name the file asked for and the cause
        tmp_path.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def finite(obj):
    """`obj` with every non-finite float (inf, nan: a change that could not be computed, an unset limit) as None, in
    nested dicts and lists, so that its JSON is strict."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj
