"""SGLang's own sources for the contract test: a release's wheel, downloaded once with pip (no dependencies) into a
cache and read out of the zip; the test skips, with pip's reason, where the registry cannot be reached."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import zipfile
from pathlib import Path

CHECKED_VERSIONS = ("0.5.23",)
"""The SGLang releases the contract is checked against (ppprof.sglang.hook.BUILT_FOR among them)."""
CACHE = Path(os.environ.get("PPPROF_SGLANG_WHEELS", Path.home() / ".cache" / "ppprof" / "sglang-wheels"))
FILES = {
    "scheduler": "sglang/srt/managers/scheduler.py",
    "pp_mixin": "sglang/srt/managers/scheduler_pp_mixin.py",
    "schedule_policy": "sglang/srt/managers/schedule_policy.py",
    "sizer": "sglang/srt/managers/scheduler_components/dynamic_chunk_sizer.py",
    "batch": "sglang/srt/managers/schedule_batch.py",
    "model_config": "sglang/srt/configs/model_config.py",
    "parallel_state": "sglang/srt/distributed/parallel_state.py",
    "runtime_context": "sglang/srt/runtime_context.py",
    "utils_common": "sglang/srt/utils/common.py",
    "forward_batch_info": "sglang/srt/model_executor/forward_batch_info.py",
}


@functools.cache
def wheel(version: str) -> tuple[Path | None, str]:
    """(the cached wheel, "") or (None, why it could not be had)."""
    found = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0], ""
    CACHE.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                f"sglang=={version}",
                "--no-deps",
                "--only-binary",
                ":all:",
                "--retries",
                "1",
                "--timeout",
                "30",
                "-q",
                "-d",
                str(CACHE),
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"pip download sglang=={version} did not finish ({e})"
    found = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
    if r.returncode or not found:
        why = (r.stderr.strip().splitlines() or ["no wheel"])[-1]
        return None, f"pip download sglang=={version} failed (registry unreachable?): {why}"
    return found[0], ""


@functools.cache
def sources(version: str) -> dict[str, str]:
    """FILES of the release, by key; pytest.skip where the wheel cannot be had."""
    import pytest

    path, why = wheel(version)
    if path is None:
        pytest.skip(why)
    with zipfile.ZipFile(path) as z:
        return {key: z.read(name).decode() for key, name in FILES.items()}
