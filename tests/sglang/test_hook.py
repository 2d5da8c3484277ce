"""The start-up hook in fresh interpreters: ppprof-sglang.pth processed as Python processes a site folder at start,
and `python -m ppprof.sglang` (the hook first on PYTHONPATH, inherited by spawned processes). SGLang is not
installed here, so a stand-in package with SGLang's module names and the shapes the contract test reads in SGLang
0.5.23 (the sizer's keyword-only constructor, the scheduler binding it by name and building it in
maybe_init_dynamic_chunk_sizer) takes its place."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ppprof.forwards import read_forwards
from ppprof.policy import load
from ppprof.sglang import hook

from .standin import REPO, shaped

PTH = REPO / "ppprof" / "sglang" / "ppprof-sglang.pth"
BASELINE = REPO / "results" / "baseline" / "policy.json"
KWARGS = ", ".join(hook.SIZER_KWARGS)


def write_standin(root: Path, extra_kwarg: str = "") -> Path:
    """The stand-in sglang package under root: its sizer (SGLang's constructor, `extra_kwarg` added), scheduler,
    runtime context (2 stages, 1 TP rank, one process in the world group) and device module (a CPU's)."""
    files = {
        "sglang/__init__.py": "",
        "sglang/srt/__init__.py": "",
        "sglang/srt/managers/__init__.py": "",
        "sglang/srt/managers/scheduler_components/__init__.py": "",
        "sglang/srt/utils/__init__.py": "",
        "sglang/srt/utils/common.py": "def get_device_module():\n    return object()\n",
        "sglang/srt/runtime_context.py": """
            from types import SimpleNamespace

            def get_parallel():
                world = SimpleNamespace(all_gather_object=lambda o: [o])
                return SimpleNamespace(pp_size=2, tp_size=1, pp_rank=1, tp_rank=0, world_group=world)
        """,
        "sglang/srt/managers/scheduler_components/dynamic_chunk_sizer.py": f"""
            from sglang.srt.runtime_context import get_parallel

            class DynamicChunkSizer:
                def __init__(self, *, {KWARGS}{extra_kwarg}):
                    pass

                def profile_and_fit(self):
                    return False

                def predict(self, history_len):
                    return None
        """,
        "sglang/srt/managers/scheduler.py": """
            from sglang.srt.managers.scheduler_components.dynamic_chunk_sizer import DynamicChunkSizer

            class Scheduler:
                def __init__(self, model_config, chunked_prefill_size):
                    self.model_config, self.chunked_prefill_size = model_config, chunked_prefill_size
                    self.chunked_req = None

                def maybe_init_dynamic_chunk_sizer(self):
                    self.dynamic_chunk_sizer = None
                    sizer = DynamicChunkSizer(
                        model_runner=None, model_config=self.model_config, tree_cache=None, req_to_token_pool=None,
                        token_to_kv_pool_allocator=None, spec_algorithm=None,
                        chunked_prefill_size=self.chunked_prefill_size, max_prefill_tokens=16384, page_size=1,
                        device="cpu",
                    )
                    if sizer.profile_and_fit():
                        self.dynamic_chunk_sizer = sizer

                def get_new_batch_prefill(self, running_batch):
                    return self.chunked_prefill_size

                def run_batch(self, batch, pp_proxy_tensors=None):
                    return len(batch.reqs)
        """,
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root


SERVE = """
import json, logging, site, sys
from types import SimpleNamespace
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
site.addsitedir(sys.argv[1])  # a site folder: its .pth runs, as at start
loaded_at_start = "ppprof" in sys.modules
from sglang.srt.managers import scheduler
from sglang.srt.managers.scheduler_components import dynamic_chunk_sizer
config = SimpleNamespace(context_len=32768, hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, hf_config=SimpleNamespace(model_type="nemotron_h"))
out = {"loaded_at_start": loaded_at_start, "class": scheduler.DynamicChunkSizer.__module__,
       "same_in_both": scheduler.DynamicChunkSizer is dynamic_chunk_sizer.DynamicChunkSizer}
for B in (512, 8192):
    s = scheduler.Scheduler(config, B)
    s.maybe_init_dynamic_chunk_sizer()
    out[B] = None if s.dynamic_chunk_sizer is None else [s.dynamic_chunk_sizer.predict(L) for L in (512, 4096)]
s.device = "cpu"
extend = SimpleNamespace(is_extend=lambda: True)
batch = SimpleNamespace(reqs=[1, 2], prefix_lens=[512, 0], extend_lens=[256, 128], forward_mode=extend)
decode = SimpleNamespace(reqs=[1], prefix_lens=[], extend_lens=[], forward_mode=SimpleNamespace(is_extend=lambda: False))
out["ran"] = [s.run_batch(batch), s.run_batch(decode), s.run_batch(batch)]
out["wrapped"] = hasattr(scheduler.Scheduler.run_batch, "__wrapped__")
out["first_chunk"] = getattr(scheduler.Scheduler.get_new_batch_prefill, "_ppprof_first_chunk", False)
from ppprof.sglang import trace
trace.close(s)
print(json.dumps(out))
"""


def serve(
    tmp_path: Path, policy: Path | None, extra_kwarg: str = "", trace: Path | None = None
) -> tuple[dict, list[str]]:
    """Run SERVE in a fresh interpreter with the .pth in a site folder, PPPROF_POLICY=policy and PPPROF_TRACE=trace
    where given; (its result, its stderr lines)."""
    site_dir = tmp_path / "site"
    site_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(PTH, site_dir)
    standin = write_standin(tmp_path / "standin", extra_kwarg)
    env = {k: v for k, v in os.environ.items() if k not in (hook.POLICY_ENV, hook.TRACE_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(standin)])
    if policy is not None:
        env[hook.POLICY_ENV] = str(policy)
    if trace is not None:
        env[hook.TRACE_ENV] = str(trace)
    r = subprocess.run(
        [sys.executable, "-c", SERVE, str(site_dir)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout), r.stderr.strip().splitlines()


def test_with_the_policy_named_sglangs_scheduler_builds_ppprofs_sizer(tmp_path):
    policy = shaped(BASELINE, tmp_path)
    out, lines = serve(tmp_path, policy)
    assert out["loaded_at_start"] and out["class"] == "ppprof.sglang.sizer" and out["same_in_both"], out
    p = load(policy)
    assert out["512"] == [p.next_chunk_size(512), p.next_chunk_size(4096)] and out["8192"] is None, out
    replaced = [x for x in lines if "is ppprof's policy sizer in this process" in x]
    assert replaced == [
        f"ppprof: SGLang's DynamicChunkSizer is ppprof's policy sizer in this process "
        f"(PPPROF_POLICY={policy}; built for SGLang {hook.BUILT_FOR}, found unknown)"
    ], lines
    matched = [x for x in lines if "matches this server" in x]
    refused = [x for x in lines if "refused" in x]
    assert len(matched) == 1 and len(refused) == 1 and "chunked_prefill_size: server 8192" in refused[0], lines
    assert out["first_chunk"] and not [x for x in lines if "first chunks stay" in x], lines  # get_new_batch_prefill
    print("\n".join(lines))  # the log of a matched and of a refused load (pytest -s shows them)


def test_without_the_policy_nothing_of_ppprof_is_imported_and_nothing_said(tmp_path):
    out, lines = serve(tmp_path, None)
    assert not out["loaded_at_start"] and out["class"].startswith("sglang."), out
    assert out["512"] is None and out["8192"] is None and lines == [], lines
    assert not out["wrapped"] and out["ran"] == [2, 1, 2], out  # run_batch is SGLang's own: tracing costs nothing
    assert not out["first_chunk"], out  # and so is get_new_batch_prefill


def test_with_the_trace_named_each_prefill_forward_is_written_and_a_bad_path_is_one_line(tmp_path):
    """PPPROF_TRACE alone (no policy): run_batch is wrapped, its prefill forwards (not the decode) go into PATH.rank1
    (PP rank 1 of the stand-in), each piece's prefix and extend lengths from the batch; a path that cannot be
    written turns the trace off with one line and the batches still run."""
    out, lines = serve(tmp_path, None, trace=tmp_path / "t.jsonl")
    assert out["loaded_at_start"] and out["class"].startswith("sglang.") and out["wrapped"], out
    assert out["ran"] == [2, 1, 2] and lines == [], lines
    forwards = read_forwards([tmp_path / "t.jsonl.rank1"])
    assert forwards.stage == [1, 1] and forwards.pieces == [((512, 256), (0, 128))] * 2, forwards
    assert forwards.header["server"] == "sglang" and forwards.header["clock"] == "perf_counter", forwards.header
    out, lines = serve(tmp_path / "bad", None, trace=tmp_path / "no-such-folder" / "t.jsonl")
    assert out["ran"] == [2, 1, 2] and len(lines) == 1, lines
    assert "t.jsonl.rank1 cannot be written (No such file or directory): tracing is off, serving goes on" in lines[0]


def test_a_changed_sglang_is_left_alone_with_one_line_why(tmp_path):
    out, lines = serve(tmp_path, shaped(BASELINE, tmp_path), extra_kwarg=", pp_group=None, pp_rank=0")
    assert out["class"].startswith("sglang.") and out["512"] is None, out
    assert len(lines) == 1 and lines[0].startswith(
        "ppprof: SGLang left alone (its own start-up profile sizes chunks): DynamicChunkSizer.__init__ takes ("
    ), lines
    assert "new: ['pp_group', 'pp_rank']" in lines[0]


LAUNCHED = """
import json, multiprocessing, sys

def child(queue):
    from sglang.srt.managers import scheduler
    queue.put(scheduler.DynamicChunkSizer.__module__)

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")  # as SGLang starts its schedulers
    queue = ctx.Queue()
    p = ctx.Process(target=child, args=(queue,))
    p.start()
    print(json.dumps({"args": sys.argv[1:], "child": queue.get(timeout=60)}))
    p.join()
"""


def launch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    standin = write_standin(tmp_path / "standin")
    (standin / "launched.py").write_text(LAUNCHED)
    env = {k: v for k, v in os.environ.items() if k != hook.POLICY_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(standin)])
    return subprocess.run(
        [sys.executable, "-m", "ppprof.sglang", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def test_the_launcher_reaches_spawned_processes(tmp_path):
    policy = shaped(BASELINE, tmp_path)
    server_args = ["--enable-dynamic-chunking", "--chunked-prefill-size", "512", "--pp-size", "2"]
    r = launch(tmp_path, "--policy", str(policy), "--server-module", "launched", "--", *server_args)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"args": server_args, "child": "ppprof.sglang.sizer"}, out


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "no server arguments: give SGLang's after --"),
        (["--", "--chunked-prefill-size", "512"], "--enable-dynamic-chunking is not among the server's arguments"),
        (
            ["--", "--enable-dynamic-chunking"],
            "--chunked-prefill-size (not given): the policy's base_chunk_size is 512",
        ),
        (["--", "--enable-dynamic-chunking", "--chunked-prefill-size=8192"], "pass --chunked-prefill-size 512"),
        (
            ["--", "--enable-dynamic-chunking", "--chunked-prefill-size", "512", "--max-prefill-tokens", "64"],
            "--max-prefill-tokens 64: below the policy's largest chunk",
        ),
    ],
)
def test_the_launcher_refuses_arguments_that_cannot_carry_the_policy(tmp_path, args, message):
    r = launch(tmp_path, "--policy", str(shaped(BASELINE, tmp_path)), "--server-module", "launched", *args)
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and message in r.stderr, r.stderr


def test_the_launcher_refuses_a_policy_that_does_not_load(tmp_path):
    r = launch(tmp_path, "--policy", str(tmp_path / "none.json"), "--", "--enable-dynamic-chunking")
    assert r.returncode == 2 and "does not exist: run `ppprof fit` first" in r.stderr, r.stderr
