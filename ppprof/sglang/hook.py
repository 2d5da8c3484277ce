"""The start-up hook: where PPPROF_POLICY is set, SGLang's DynamicChunkSizer becomes ppprof's policy sizer
(ppprof.sglang.sizer) as SGLang imports it, in every process of the server, if SGLang's names and signatures are
those the sizer was built for; otherwise SGLang is left alone, with one line saying why. With ppprof's sizer in place,
Scheduler.get_new_batch_prefill is wrapped so that a batch formed with no chunked request is budgeted at the policy's
first chunk for the waiting queue's head, not at B (ppprof.sglang.first_chunk). Where PPPROF_TRACE is set,
Scheduler.run_batch is wrapped to trace each prefill forward (ppprof.sglang.trace), on the same terms.

Installed at interpreter start by ppprof-sglang.pth (site-packages) or by `python -m ppprof.sglang` (PYTHONPATH);
imports only the standard library (and ppprof.bounds) until SGLang's sizer module loads."""

from __future__ import annotations

import os
import sys

from ppprof.bounds import POLICY_ENV, TRACE_ENV  # the hook does nothing without one of them

SIZER_MODULE = "sglang.srt.managers.scheduler_components.dynamic_chunk_sizer"
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
RUNTIME_MODULE = "sglang.srt.runtime_context"
SIZER_CLASS = "DynamicChunkSizer"
SCHEDULER_CLASS = "Scheduler"
SCHEDULER_METHOD = "maybe_init_dynamic_chunk_sizer"
SIZER_KWARGS = (
    "model_runner",
    "model_config",
    "tree_cache",
    "req_to_token_pool",
    "token_to_kv_pool_allocator",
    "spec_algorithm",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "page_size",
    "device",
)
"""The keyword-only arguments of SGLang 0.5.23's DynamicChunkSizer, which its scheduler passes."""
BUILT_FOR = "0.5.23"
"""The SGLang release whose scheduler and sizer the contract test reads (tests/sglang/test_contract.py)."""

_state = {"sglang_class": None, "replaced": False}


def say(message: str) -> None:
    """One line on stderr: SGLang's logging is not set up yet when it imports its modules."""
    sys.stderr.write(f"ppprof: {message}\n")
    sys.stderr.flush()


def install() -> bool:
    """Watch for SGLang's sizer and scheduler modules (once a process); False where neither PPPROF_POLICY nor
    PPPROF_TRACE is set or the watch could not be set. Never raises: a start-up hook must not stop the interpreter."""
    if not os.environ.get(POLICY_ENV) and not os.environ.get(TRACE_ENV):
        return False
    try:
        if not any(isinstance(f, Watcher) for f in sys.meta_path):
            sys.meta_path.insert(0, Watcher())
        # Modules imported before the hook (installed late, in the same process) are handled now.
        if SIZER_MODULE in sys.modules:
            on_sizer_module(sys.modules[SIZER_MODULE])
        if SCHEDULER_MODULE in sys.modules:
            on_scheduler_module(sys.modules[SCHEDULER_MODULE])
        return True
    except Exception as e:  # noqa: BLE001 - whatever it is, the interpreter goes on without the hook
        say(f"the SGLang hook is not installed ({e!r}); SGLang sizes chunks itself")
        return False


class Watcher:
    """A meta path finder that finds SGLang's two modules as the rest of sys.meta_path would, and runs a check and
    patch right after each module's own code (as post-import hooks do), before the scheduler binds the sizer's
    name with its `from ... import DynamicChunkSizer`."""

    def __init__(self):
        self.finding: set[str] = set()

    def find_spec(self, fullname, path, target=None):
        after = {SIZER_MODULE: on_sizer_module, SCHEDULER_MODULE: on_scheduler_module}.get(fullname)
        if after is None or fullname in self.finding:  # a finder below that asks sys.meta_path again
            return None
        self.finding.add(fullname)
        try:
            spec = next(
                (
                    s
                    for f in sys.meta_path
                    if f is not self and hasattr(f, "find_spec")
                    for s in [f.find_spec(fullname, path, target)]
                    if s is not None
                ),
                None,
            )
        finally:
            self.finding.discard(fullname)
        if spec is None:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = ThenLoader(spec.loader, after)
        return spec

    def invalidate_caches(self) -> None:
        pass


class ThenLoader:
    """The module's own loader, then `after(module)`; everything else (get_source, ...) is the loader's."""

    def __init__(self, loader, after):
        self.loader, self.after = loader, after

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        # The module keeps its real loader (linecache, inspect and reloads ask it, not this wrapper).
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            self.after(module)
        except Exception as e:  # noqa: BLE001 - a failed patch leaves SGLang as it is
            restore()
            say(f"SGLang left alone: checking {module.__name__} failed ({e!r})")

    def __getattr__(self, name):
        return getattr(self.loader, name)


def sizer_mismatch(module) -> str | None:
    """Why SGLang's sizer module is not the one ppprof's sizer stands in for, or None: its class (class_mismatch)
    and SGLang's parallel state, which the sizer reads."""
    cls = getattr(module, SIZER_CLASS, None)
    if not isinstance(cls, type):
        return f"{module.__name__} has no class {SIZER_CLASS}"
    problem = class_mismatch(cls)
    if problem:
        return problem
    runtime = sys.modules.get(RUNTIME_MODULE)
    if runtime is None or not callable(getattr(runtime, "get_parallel", None)):
        return f"{RUNTIME_MODULE}.get_parallel is not loaded with the sizer, as in SGLang {BUILT_FOR}"
    return None


def class_mismatch(cls: type) -> str | None:
    """Why `cls` is not the DynamicChunkSizer of SGLang BUILT_FOR, or None: its keyword-only arguments (exactly
    SIZER_KWARGS), profile_and_fit() and predict(prefix length)."""
    import inspect

    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    names = tuple(p.name for p in params)
    if set(names) != set(SIZER_KWARGS) or any(p.kind is not p.KEYWORD_ONLY for p in params):
        new = sorted(set(names) - set(SIZER_KWARGS)) or "none"
        gone = sorted(set(SIZER_KWARGS) - set(names)) or "none"
        return (
            f"{SIZER_CLASS}.__init__ takes ({', '.join(names)}), not the keyword-only arguments of SGLang "
            f"{BUILT_FOR} (new: {new}, gone: {gone})"
        )
    for method, count in (("profile_and_fit", 0), ("predict", 1)):
        fn = getattr(cls, method, None)
        if not callable(fn):
            return f"{SIZER_CLASS} has no method {method}"
        args = list(inspect.signature(fn).parameters.values())[1:]
        if len(args) != count or any(a.kind not in (a.POSITIONAL_ONLY, a.POSITIONAL_OR_KEYWORD) for a in args):
            return f"{SIZER_CLASS}.{method}{inspect.signature(fn)} is not {method} of SGLang {BUILT_FOR}"
    return None


def scheduler_mismatch(module) -> str | None:
    """Why SGLang's scheduler is not the one the sizer was built for, or None: its Scheduler has
    maybe_init_dynamic_chunk_sizer, which builds the sizer as call_mismatch wants (read from its source)."""
    import inspect

    method = getattr(getattr(module, SCHEDULER_CLASS, None), SCHEDULER_METHOD, None)
    if not callable(method):
        return f"{module.__name__}.{SCHEDULER_CLASS} has no method {SCHEDULER_METHOD}"
    return call_mismatch(inspect.getsource(method))


def call_mismatch(method_source: str) -> str | None:
    """Why the source of maybe_init_dynamic_chunk_sizer does not build the sizer once, with SIZER_KWARGS as its
    only (keyword) arguments, or None."""
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(method_source))
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == SIZER_CLASS
    ]
    if len(calls) != 1:
        return f"{SCHEDULER_CLASS}.{SCHEDULER_METHOD} builds {SIZER_CLASS} {len(calls)} times, not once"
    keywords = tuple(str(k.arg) for k in calls[0].keywords)
    if calls[0].args or set(keywords) != set(SIZER_KWARGS):
        return f"{SCHEDULER_CLASS}.{SCHEDULER_METHOD} passes ({', '.join(keywords)}) to {SIZER_CLASS}"
    return None


def on_sizer_module(module) -> None:
    """Check SGLang's sizer module; replace its class by ppprof's policy sizer, or say why not (with PPPROF_POLICY
    set; SGLang's own class is kept for sglang_sizer_class either way)."""
    if _state["sglang_class"] is None and isinstance(getattr(module, SIZER_CLASS, None), type):
        _state["sglang_class"] = getattr(module, SIZER_CLASS)
    if _state["replaced"] or not os.environ.get(POLICY_ENV):
        return
    problem = sizer_mismatch(module)
    if problem:
        say(f"SGLang left alone (its own start-up profile sizes chunks): {problem}")
        return
    from ppprof.sglang.sizer import PolicySizer

    _state["sglang_class"] = getattr(module, SIZER_CLASS)
    setattr(module, SIZER_CLASS, PolicySizer)
    _state["replaced"] = True


def on_scheduler_module(module) -> None:
    """Check SGLang's scheduler; point its sizer name at ppprof's (it bound the name while importing), or put
    SGLang's own sizer back and say why; wrap its run_batch where PPPROF_TRACE is set."""
    if os.environ.get(TRACE_ENV):
        install_trace(module)
    if not _state["replaced"]:
        return
    problem = scheduler_mismatch(module)
    if problem:
        restore()
        say(f"SGLang left alone (its own start-up profile sizes chunks): {problem}")
        return
    from ppprof.sglang.sizer import PolicySizer

    setattr(module, SIZER_CLASS, PolicySizer)
    install_first_chunk(module)
    say(
        f"SGLang's {SIZER_CLASS} is ppprof's policy sizer in this process (PPPROF_POLICY="
        f"{os.environ.get(POLICY_ENV)}; built for SGLang {BUILT_FOR}, found {sglang_version()})"
    )


def install_first_chunk(module) -> bool:
    """Wrap `module`.Scheduler.get_new_batch_prefill (ppprof.sglang.first_chunk.first_chunked), where it is SGLang
    BUILT_FOR's method, get_new_batch_prefill(self, running_batch); otherwise say why, once, and leave SGLang's first
    chunk of B."""
    from ppprof.sglang.first_chunk import FIRST_CHUNK, PREFILL_METHOD, first_chunked

    same = lambda params: params == ["self", "running_batch"]  # noqa: E731
    return wrap(module, PREFILL_METHOD, FIRST_CHUNK, same, first_chunked, "first chunks stay SGLang's B")


def install_trace(module) -> bool:
    """Wrap `module`.Scheduler.run_batch (SGLang's scheduler module) to trace prefill forwards
    (ppprof.sglang.trace), where it is the method of SGLang BUILT_FOR, run_batch(self, batch, ...); otherwise say
    why, once, and leave it."""
    from ppprof.sglang.trace import RUN_BATCH, WRAPPED, traced

    same = lambda params: params[:2] == ["self", "batch"]  # noqa: E731
    return wrap(module, RUN_BATCH, WRAPPED, same, traced, "no forward trace")


def wrap(module, name: str, marker: str, same_params, wrapper, refusal: str) -> bool:
    """Put `wrapper`(method) in the place of `module`.Scheduler.`name` (once: `marker` set on the wrapped method
    says it is done) where the method exists and its parameter names pass `same_params`; otherwise say `refusal` and
    why in one line, and leave SGLang's method."""
    import inspect

    cls = getattr(module, SCHEDULER_CLASS, None)
    method = getattr(cls, name, None)
    if not callable(method):
        say(f"{refusal}: {module.__name__}.{SCHEDULER_CLASS} has no method {name}")
        return False
    if getattr(method, marker, False):
        return True
    if not same_params(list(inspect.signature(method).parameters)):
        say(f"{refusal}: {SCHEDULER_CLASS}.{name}{inspect.signature(method)} is not SGLang {BUILT_FOR}'s")
        return False
    setattr(cls, name, wrapper(method))
    return True


def sglang_sizer_class() -> type:
    """SGLang's own DynamicChunkSizer, whether or not ppprof's stands in for it in this process."""
    import importlib

    return _state["sglang_class"] or getattr(importlib.import_module(SIZER_MODULE), SIZER_CLASS)


def restore() -> None:
    """SGLang's own sizer class back in both modules."""
    original = _state["sglang_class"]
    if original is None:
        return
    for name in (SIZER_MODULE, SCHEDULER_MODULE):
        if name in sys.modules and hasattr(sys.modules[name], SIZER_CLASS):
            setattr(sys.modules[name], SIZER_CLASS, original)
    _state["replaced"] = False


def sglang_version() -> str:
    """The installed sglang distribution's version, or "unknown"."""
    from importlib import metadata

    try:
        return metadata.version(SIZER_MODULE.partition(".")[0])  # the distribution is named as its top package
    except metadata.PackageNotFoundError:
        return "unknown"


def run_shadowed_sitecustomize(own_file: str) -> None:
    """Run the sitecustomize module that `own_file` (on-pythonpath/sitecustomize.py, first on PYTHONPATH) shadows: the first one on
    sys.path after its folder, as Python would have run it. A failure there is said, as Python's site says it."""
    import importlib.machinery
    import importlib.util

    folder = os.path.dirname(os.path.abspath(own_file))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != folder]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except Exception as e:  # noqa: BLE001
        say(f"the sitecustomize at {spec.origin} failed ({e!r})")
