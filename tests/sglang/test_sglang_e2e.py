"""Where sglang itself is installed (a GPU machine): in a fresh interpreter with the start-up hook, SGLang's own
scheduler module binds ppprof's sizer, and the sizer it builds reads SGLang's real parallel state (outside a running
server that state is not published, so the load is refused with one line, and nothing is raised)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from ppprof.sglang import hook

from .standin import REPO, shaped

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed here")

BUILD = """
import json, logging, site, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
site.addsitedir(sys.argv[1])
from sglang.srt.managers import scheduler
from ppprof.sglang.hook import SIZER_KWARGS
parts = dict.fromkeys(SIZER_KWARGS)
parts.update(chunked_prefill_size=512, max_prefill_tokens=16384, page_size=1, device="cuda")
sizer = scheduler.DynamicChunkSizer(**parts)
print(json.dumps({"class": scheduler.DynamicChunkSizer.__module__, "loaded": sizer.profile_and_fit(),
                  "predict": sizer.predict(512)}))
"""


def test_sglangs_scheduler_binds_and_builds_ppprofs_sizer(tmp_path):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    shutil.copy(REPO / "ppprof" / "sglang" / "ppprof-sglang.pth", site_dir)
    env = {
        **os.environ,
        hook.POLICY_ENV: str(shaped(REPO / "results" / "baseline" / "policy.json", tmp_path)),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    r = subprocess.run(
        [sys.executable, "-c", BUILD, str(site_dir)], capture_output=True, text=True, env=env, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"class": "ppprof.sglang.sizer", "loaded": False, "predict": None}, (out, r.stderr[-3000:])
    assert "is ppprof's policy sizer in this process" in r.stderr, r.stderr[-3000:]
    assert "SGLang's parallel state is not readable" in r.stderr, r.stderr[-3000:]
