"""Atomic file output: every file ppprof writes appears whole or not at all, never replaces what is not a regular file
(a character device such as /dev/null is written into, a folder or another special file is refused), and appended
files are opened without following a symbolic link; bounded input: small files read only when regular and small,
JSON and YAML refused past MAX_DEPTH levels; and strict JSON (`finite`)."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


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
            raise OSError(
                e.errno, "is a symbolic link, which ppprof does not append through; remove it", str(path)
            ) from None
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


MAX_INPUT_BYTES = 16 * 2**20
"""The largest settings file, model spec, HF config.json, policy, run.json or plans file ppprof reads: each takes a
few KB, so a file past this is not one (and /dev/zero would be read until memory runs out)."""
MAX_DEPTH = 64
"""The deepest nesting of lists and mappings ppprof reads in a JSON or YAML input: its own files nest 5 deep."""


def read_small_text(path: str | os.PathLike, what: str, fix: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of a small input file. ValueError `"{what} {path} <problem>: {fix}"` where it is not a regular
    file (a device, a pipe: read for ever or blocked on), holds more than `max_bytes`, or is not UTF-8;
    IsADirectoryError for a folder; FileNotFoundError and other OSErrors as they come, for the caller to name."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a pipe must not block the open
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        if not stat.S_ISREG(mode):
            raise ValueError(f"{what} {path} is {special_kind(mode)}, not a file: {fix}")
        data = f.read(max_bytes + 1)  # never more, whatever the size said (the file may grow)
    if len(data) > max_bytes:
        raise ValueError(f"{what} {path} holds more than {max_bytes // 2**20} MiB, more than any such file: {fix}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {path} is not UTF-8 text (byte {e.start}): {fix}") from None


def special_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words ("a character device", "a folder", ...), from its mode."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode):
        return "a character device"
    return "a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a block device"


def parse_json(text: str, label: str, **loads_kwargs) -> Any:
    """json.loads(text), with nesting deeper than MAX_DEPTH refused: ValueError `"{label} nests ... at $.path"`
    instead of a RecursionError (or a structure every later check would recurse through). json.JSONDecodeError
    passes through."""
    try:
        data = json.loads(text, **loads_kwargs)
    except RecursionError:
        raise too_deep(label, deep_place(text)) from None
    check_depth(data, label)
    return data


_TOKEN = re.compile(r'"(?P<quoted>(?:[^"\\]|\\.)*)"(?P<colon>\s*:)?|(?P<bare>[A-Za-z_][\w-]*)\s*:|[\[\]{},]')
"""A scan's tokens: a string (a key where a colon follows), a bare YAML key, a bracket or a comma."""


def deep_place(text: str) -> str:
    """Where JSON (or flow-style YAML) `text` first nests deeper than MAX_DEPTH, as `$.key[index]...` (keys and
    indices of the way there), found with a scan of its tokens, not a parse."""
    stack: list[list] = []  # [bracket, key or index]
    for m in _TOKEN.finditer(text):
        token = m.group(0)
        if token in "[{":
            if len(stack) >= MAX_DEPTH:
                break
            stack.append([token, 0 if token == "[" else None])
        elif token in "]}":
            stack and stack.pop()
        elif token == ",":
            if stack and stack[-1][0] == "[":
                stack[-1][1] += 1
        elif m.group("bare") and not stack:
            stack.append(["{", m.group("bare")])  # a block-style YAML key at the top
        elif (m.group("colon") or m.group("bare")) and stack and stack[-1][0] == "{":
            stack[-1][1] = m.group("quoted") if m.group("colon") else m.group("bare")
    return short_place(["$"] + [f"[{k}]" if b == "[" else f".{k}" for b, k in stack])


def short_place(parts: list[str]) -> str:
    """A JSON path of many levels as its first few and the depth: `$.model[0][0]..., 64 levels down`."""
    return "".join(parts) if len(parts) <= 5 else "".join(parts[:5]) + f"..., {len(parts) - 1} levels down"


def parse_yaml(text: str, label: str) -> Any:
    """yaml.safe_load(text), with nesting deeper than MAX_DEPTH refused as parse_json does; yaml.YAMLError passes
    through."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise too_deep(label, deep_place(text)) from None
    check_depth(data, label)
    return data


def check_depth(data: Any, label: str) -> None:
    """ValueError (too_deep) naming the first place where `data` nests deeper than MAX_DEPTH; walked with a stack, not
    recursion."""
    if not isinstance(data, (dict, list)):
        return
    stack = [(data, ["$"])]
    while stack:
        node, where = stack.pop()
        if len(where) > MAX_DEPTH:
            raise too_deep(label, short_place(where))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, (dict, list)):
                stack.append((value, where + [f".{key}" if isinstance(node, dict) else f"[{key}]"]))


class TooDeep(ValueError):
    """An input nested deeper than MAX_DEPTH; its message is the whole one-line error."""


def too_deep(label: str, where: str) -> TooDeep:
    return TooDeep(
        f"{label} nests lists or mappings deeper than {MAX_DEPTH} levels (at {where}): no ppprof input "
        "does; give the right file"
    )


MAX_APPENDED_BYTES = 2**30
"""The largest JSONL file append_lines extends (it rewrites the file whole, atomically)."""


def append_lines(path: str | os.PathLike, objects: list[dict]) -> Path:
    """`objects` appended to the JSONL file at `path` (created where absent), one JSON object a line, the file replaced
    atomically with its old lines and the new (a reader sees the old file or the new one, never half a line)."""
    path = Path(path)
    old = b""
    if path.exists():
        if not path.is_file():
            raise ValueError(f"{path} is {special_kind(os.stat(path).st_mode)}: give a JSONL file to append to")
        if path.stat().st_size > MAX_APPENDED_BYTES:
            raise ValueError(f"{path} is over {MAX_APPENDED_BYTES} bytes: give a new file to append to")
        old = path.read_bytes()
        if old and not old.endswith(b"\n"):
            old += b"\n"
    new = "".join(json.dumps(finite(o)) + "\n" for o in objects).encode()
    return atomic_write(path, lambda p: p.write_bytes(old + new))
