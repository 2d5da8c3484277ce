"""Atomic file output: every file ppprof writes appears whole or not at all, never replaces what is not a regular file
(a character device such as /dev/null is written into, a folder or another special file is refused), and appended
files are opened without following a symbolic link; and strict JSON (`finite`)."""

from __future__ import annotations

import json
import math
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp_path)` on a temporary file beside `path`, then rename it over `path` (a symbolic link there is
    replaced, not followed). Where `path` is a character device (/dev/null, a terminal) `write` writes into it
    directly: renaming over it would delete the device. Any other existing target that is not a regular file (a
    folder, a pipe, a socket, a block device) is refused with an OSError naming it."""
    path = Path(path)
    kind = target_kind(path)
    if kind == "device":
        try:
            write(path)
        except OSError as e:
            raise OSError(e.errno, e.strerror or str(e), str(path)) from None
        return path
    if kind is not None:
        raise OSError(errno.EEXIST, f"exists and is {kind}, not a file; give a file path", str(path))
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


def target_kind(path: Path) -> str | None:
    """None where `path` is absent, a regular file or a symbolic link (replaced as a whole); "device" for a character
    device; else what it is, in words ("a folder", "a pipe", ...)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        return None
    if stat.S_ISCHR(mode):
        return "device"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a block device"


def open_append(path: str | os.PathLike):
    """`path` opened to append text, created if absent, without following a symbolic link there (which could point at
    any file of the user running ppprof); an OSError names the file and the fix."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(e.errno, "is a symbolic link, which ppprof does not append through; remove it", str(path)) \
                from None
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None
    return os.fdopen(fd, "a")


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
