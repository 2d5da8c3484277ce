"""The contract with SGLang, read from its released wheel (tests/sglang/wheel.py; skipped, with the reason, where the
registry cannot be reached): the keywords its scheduler passes are the sizer's, the methods it calls are the sizer's
and it uses their results as the sizer means them, and what the sizer reads of SGLang is there."""

from __future__ import annotations
import __future__

import ast
import inspect
import zipfile

import pytest

from ppprof.sglang import first_chunk, hook
from ppprof.sglang.match import MODEL_CONFIG_FIELDS
from ppprof.sglang.sizer import CHUNKED_REQ, LOOP_SIZE, REQ_FIELDS, WAITING_QUEUE, PolicySizer
from ppprof.sglang.trace import BATCH_FIELDS, PARALLEL_FIELDS, RUN_BATCH, SCHEDULER_FIELDS

from .wheel import CHECKED_VERSIONS, FILES, sources, wheel

versions = pytest.mark.parametrize("version", CHECKED_VERSIONS)


def class_def(tree: ast.AST, name: str) -> ast.ClassDef:
    found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    assert len(found) == 1, f"{name=} {len(found)=}"
    return found[0]


def method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    found = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(found) == 1, f"{cls.name}.{name} {len(found)=}"
    return found[0]


def is_self_attr(node: ast.AST, attr: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def assigned_self_attrs(cls: ast.ClassDef) -> set[str]:
    """Every `self.X = ...` / `self.X: T = ...` in the class's methods."""
    out = set()
    for node in ast.walk(cls):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        out |= {
            t.attr
            for t in targets
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
        }
    return out


def scheduler_method(version: str) -> tuple[str, ast.FunctionDef]:
    src = sources(version)["scheduler"]
    return src, method(class_def(ast.parse(src), hook.SCHEDULER_CLASS), hook.SCHEDULER_METHOD)


def test_the_checked_versions_include_the_one_the_hook_was_built_for():
    assert hook.BUILT_FOR in CHECKED_VERSIONS
    assert FILES["sizer"] == hook.SIZER_MODULE.replace(".", "/") + ".py"
    assert FILES["scheduler"] == hook.SCHEDULER_MODULE.replace(".", "/") + ".py"
    assert FILES["runtime_context"] == hook.RUNTIME_MODULE.replace(".", "/") + ".py"


@versions
def test_the_scheduler_passes_exactly_the_keywords_both_sizers_take(version):
    src = sources(version)
    init = method(class_def(ast.parse(src["sizer"]), hook.SIZER_CLASS), "__init__")
    assert [a.arg for a in init.args.args] == ["self"] and not init.args.vararg and not init.args.kwarg
    assert all(d is None for d in init.args.kw_defaults), "a keyword with a default the scheduler may not pass"
    theirs = {a.arg for a in init.args.kwonlyargs}
    ours = {
        p.name
        for p in inspect.signature(PolicySizer.__init__).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.default is p.empty
    }
    assert theirs == ours == set(hook.SIZER_KWARGS), f"{theirs ^ ours=}"
    scheduler_src, fn = scheduler_method(version)
    calls = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == hook.SIZER_CLASS
    ]
    assert len(calls) == 1 and not calls[0].args
    assert {k.arg for k in calls[0].keywords} == ours
    # What the hook checks at run time, on the method's real source, accepts it.
    assert hook.call_mismatch(ast.get_source_segment(scheduler_src, fn)) is None


@versions
def test_sglangs_real_class_passes_the_hooks_signature_check_and_a_changed_one_does_not(version):
    src = sources(version)["sizer"]
    segment = ast.get_source_segment(src, class_def(ast.parse(src), hook.SIZER_CLASS))
    space: dict = {}
    # Annotations stay strings (the module's own `from __future__ import annotations`): only the signatures matter.
    exec(compile(segment, FILES["sizer"], "exec", flags=__future__.annotations.compiler_flag), space)
    assert hook.class_mismatch(space[hook.SIZER_CLASS]) is None
    changed = segment.replace("device: str,", "device: str,\n        pp_rank: int,", 1)
    assert changed != segment
    exec(compile(changed, FILES["sizer"], "exec", flags=__future__.annotations.compiler_flag), space)
    problem = hook.class_mismatch(space[hook.SIZER_CLASS])
    assert problem and "new: ['pp_rank']" in problem, problem


@versions
def test_profile_and_fit_decides_whether_the_scheduler_keeps_the_sizer(version):
    _, fn = scheduler_method(version)
    decided = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.If)
        and isinstance(n.test, ast.Call)
        and isinstance(n.test.func, ast.Attribute)
        and n.test.func.attr == "profile_and_fit"
    ]
    assert len(decided) == 1 and not decided[0].test.args and not decided[0].test.keywords
    kept = [
        s for s in decided[0].body if isinstance(s, ast.Assign) and is_self_attr(s.targets[0], "dynamic_chunk_sizer")
    ]
    assert kept, "the sizer is kept only where profile_and_fit() is true"
    sig = inspect.signature(PolicySizer.profile_and_fit)
    assert list(sig.parameters) == ["self"] and sig.return_annotation in (bool, "bool")


@versions
def test_predict_gets_the_chunked_requests_prefix_and_none_keeps_the_static_size(version):
    tree = ast.parse(sources(version)["scheduler"])
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "predict"
        and is_self_attr(n.func.value, "dynamic_chunk_sizer")
    ]
    assert len(calls) == 1 and len(calls[0].args) == 1 and not calls[0].keywords
    arg = calls[0].args[0]
    assert isinstance(arg, ast.Name)
    fn = next(f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and calls[0] in ast.walk(f))
    sources_of_arg = [
        a.value
        for a in ast.walk(fn)
        if isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == arg.id for t in a.targets)
    ]
    assert len(sources_of_arg) == 1
    value = sources_of_arg[0]
    assert isinstance(value, ast.Attribute) and value.attr == "prefix_len" and is_self_attr(value.value, CHUNKED_REQ)
    result = next(a.targets[0].id for a in ast.walk(fn) if isinstance(a, ast.Assign) and a.value is calls[0])
    guards = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.If)
        and isinstance(n.test, ast.Compare)
        and isinstance(n.test.left, ast.Name)
        and n.test.left.id == result
        and isinstance(n.test.ops[0], ast.IsNot)
    ]
    assert len(guards) == 1, "None keeps the static size"
    uses = [
        s
        for s in guards[0].body
        if isinstance(s, ast.Assign) and isinstance(s.value, ast.Name) and s.value.id == result
    ]
    assert [u.targets[0].id for u in uses] == ["chunked_prefill_size"]
    predict = inspect.signature(PolicySizer.predict)
    assert len(predict.parameters) == 2


@versions
def test_only_the_scheduler_uses_the_sizer_and_only_its_two_methods(version):
    scheduler_src = sources(version)["scheduler"]  # skips where the wheel cannot be had
    path, _ = wheel(version)
    users = set()
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if name.endswith(".py") and name.startswith("sglang/srt/"):
                text = z.read(name).decode(errors="replace")
                if hook.SIZER_CLASS in text or "dynamic_chunk_sizer" in text:
                    users.add(name)
    assert users == {FILES["scheduler"], FILES["sizer"]}, f"{users=}"
    tree = ast.parse(scheduler_src)
    used = {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and is_self_attr(n.value, "dynamic_chunk_sizer")
    }
    _, fn = scheduler_method(version)
    used |= {
        n.attr
        for n in ast.walk(fn)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "sizer"
    }
    assert used == {"predict", "profile_and_fit"}, f"{used=}"
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == hook.SIZER_MODULE]
    assert [a.name for n in imports for a in n.names] == [hook.SIZER_CLASS], "bound by name from the sizer module"


def self_calls(fn: ast.AST, name: str) -> list[ast.Call]:
    """Every `self.name(...)` in `fn`."""
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call) and is_self_attr(n.func, name)]


@versions
def test_a_batch_with_no_chunked_request_is_budgeted_at_chunked_prefill_size(version):
    """What the hook's first chunk rests on (first_chunk.first_chunked): Scheduler.get_new_batch_prefill(self, running_batch)
    forms a prefill batch through _get_new_batch_prefill_raw (its only caller in the wheel), which reads
    self.chunked_prefill_size once, after sorting the waiting queue (calc_priority), as the PrefillAdder's
    rem_chunk_tokens, replaced only by predict's answer under `self.chunked_req is not None`; neither method assigns
    it. calc_priority keeps the queue's order under fcfs without priority scheduling, the one order the hook sizes
    the head of (SchedulePolicy.policy, .enable_priority_scheduling; Scheduler.policy)."""
    src = sources(version)
    scheduler = class_def(ast.parse(src["scheduler"]), hook.SCHEDULER_CLASS)
    outer = method(scheduler, first_chunk.PREFILL_METHOD)
    assert [a.arg for a in outer.args.args] == ["self", "running_batch"] and not outer.args.defaults
    assert len(self_calls(outer, "_get_new_batch_prefill_raw")) == 1
    raw = method(scheduler, "_get_new_batch_prefill_raw")
    path, _ = wheel(version)
    with zipfile.ZipFile(path) as z:
        callers = {
            n
            for n in z.namelist()
            if n.endswith(".py") and "_get_new_batch_prefill_raw" in z.read(n).decode(errors="replace")
        }
    assert callers == {FILES["scheduler"]}, callers
    for fn in (outer, raw):
        reads = [n for n in ast.walk(fn) if is_self_attr(n, first_chunk.BUDGET_ATTR)]
        assert all(isinstance(n.ctx, ast.Load) for n in reads), f"{fn.name} assigns {first_chunk.BUDGET_ATTR}"
    reads = [n for n in ast.walk(raw) if is_self_attr(n, first_chunk.BUDGET_ATTR)]
    assert len(reads) == 1 and not [n for n in ast.walk(outer) if is_self_attr(n, first_chunk.BUDGET_ATTR)]
    local = [a for a in ast.walk(raw) if isinstance(a, ast.Assign) and a.value is reads[0]]
    assert len(local) == 1 and isinstance(local[0].targets[0], ast.Name)
    name = local[0].targets[0].id
    sort = [
        n
        for n in ast.walk(raw)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "calc_priority"
    ]
    assert len(sort) == 1 and is_self_attr(sort[0].func.value, "policy") and sort[0].lineno < local[0].lineno
    assert is_self_attr(sort[0].args[0], WAITING_QUEUE)
    rebound = [
        a for a in ast.walk(raw) if isinstance(a, ast.Assign) and any(getattr(t, "id", None) == name for t in a.targets)
    ]
    guards = [
        n
        for n in ast.walk(raw)
        if isinstance(n, ast.If) and any(is_self_attr(x, CHUNKED_REQ) for x in ast.walk(n.test))
        if any(a in ast.walk(n) for a in rebound[1:])
    ]
    assert len(rebound) == 2 and len(guards) == 1, "B is replaced only where a request is chunked"
    adders = [
        n
        for n in ast.walk(raw)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Call)
        and is_self_attr(n.func.func, "get_prefill_adder_class")
    ]
    assert len(adders) == 1 and [getattr(a, "id", None) for a in adders[0].args].index(name) == 6
    adder = method(class_def(ast.parse(src["schedule_policy"]), "PrefillAdder"), "__init__")
    assert [a.arg for a in adder.args.args][7] == "rem_chunk_tokens"
    # the order the hook sizes the head of: fcfs without priority scheduling leaves the queue as it is
    policy_tree = ast.parse(src["schedule_policy"])
    schedule = class_def(policy_tree, "SchedulePolicy")
    assert {"policy", "enable_priority_scheduling"} <= assigned_self_attrs(schedule)
    assert "policy" in assigned_self_attrs(scheduler)
    fcfs = [
        n
        for n in class_def(policy_tree, "CacheAgnosticPolicy").body
        if isinstance(n, ast.Assign) and n.targets[0].id == "FCFS"
    ]
    assert len(fcfs) == 1 and fcfs[0].value.value == "fcfs"
    calc = method(schedule, "calc_priority")
    branch = next(
        n
        for n in ast.walk(calc)
        if isinstance(n, ast.If) and is_self_attr(n.test.left if isinstance(n.test, ast.Compare) else n.test, "policy")
    )
    assert ast.unparse(branch.test) == "self.policy == CacheAgnosticPolicy.FCFS"
    assert len(branch.body) == 1 and ast.unparse(branch.body[0].test) == "self.enable_priority_scheduling"


@versions
def test_what_the_sizer_reads_of_sglang_is_there(version):
    src = sources(version)
    req = assigned_self_attrs(class_def(ast.parse(src["batch"]), "Req"))
    assert set(REQ_FIELDS) <= req, f"{set(REQ_FIELDS) - req=}"
    config = assigned_self_attrs(class_def(ast.parse(src["model_config"]), "ModelConfig"))
    assert set(MODEL_CONFIG_FIELDS) | {"hf_config"} <= config, f"{set(MODEL_CONFIG_FIELDS) - config=}"
    scheduler = assigned_self_attrs(class_def(ast.parse(src["scheduler"]), hook.SCHEDULER_CLASS))
    assert CHUNKED_REQ in scheduler and WAITING_QUEUE in scheduler, f"{scheduler & {CHUNKED_REQ, WAITING_QUEUE}=}"
    # the slots the under-load rule fills: the PP loop's size, pp_size + pp_async_batch_depth, on the scheduler
    mixin = class_def(ast.parse(src["pp_mixin"]), "SchedulerPPMixin")
    assert "SchedulerPPMixin" in {
        getattr(b, "id", None) for b in class_def(ast.parse(src["scheduler"]), hook.SCHEDULER_CLASS).bases
    }
    loop = [
        n.value
        for n in ast.walk(mixin)
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        and any(
            isinstance(t, ast.Attribute) and t.attr == LOOP_SIZE
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        )
    ]
    assert len(loop) == 1 and isinstance(loop[0], ast.BinOp) and isinstance(loop[0].op, ast.Add), f"{loop=}"
    assert {loop[0].left.attr, loop[0].right.attr} == {"pp_size", "pp_async_batch_depth"}, ast.dump(loop[0])
    runtime = ast.parse(src["runtime_context"])
    assert any(isinstance(n, ast.FunctionDef) and n.name == "get_parallel" for n in runtime.body)
    read = set()  # what SGLang's own code reads of get_parallel(): the sizer reads only those
    for key in ("sizer", "scheduler"):
        tree = ast.parse(src[key])
        holders = {
            t.id
            for a in ast.walk(tree)
            if isinstance(a, ast.Assign)
            and isinstance(a.value, ast.Call)
            and getattr(a.value.func, "id", None) == "get_parallel"
            for t in a.targets
            if isinstance(t, ast.Name)
        }
        read |= {
            n.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and (
                (isinstance(n.value, ast.Call) and getattr(n.value.func, "id", None) == "get_parallel")
                or (isinstance(n.value, ast.Name) and n.value.id in holders)
            )
        }
    assert {"pp_size", "tp_size", "world_group"} <= read, f"{read=}"
    group = method(class_def(ast.parse(src["parallel_state"]), "GroupCoordinator"), "all_gather_object")
    assert [a.arg for a in group.args.args] == ["self", "obj"]
    assert any(
        isinstance(n, ast.FunctionDef) and n.name == "get_device_module" for n in ast.parse(src["utils_common"]).body
    )


@versions
def test_every_pp_loop_runs_its_batches_through_run_batch_on_the_forward_stream(version):
    """The trace hook wraps Scheduler.run_batch(self, batch, pp_proxy_tensors=None): event_loop_pp and the
    prefill-only loop event_loop_pp_disagg_prefill launch each batch through _pp_launch_batch, which calls it inside
    the forward stream's context (so CUDA events recorded around it bracket the forward); the loops without PP call
    it too."""
    src = sources(version)
    scheduler = class_def(ast.parse(src["scheduler"]), hook.SCHEDULER_CLASS)
    run = method(scheduler, RUN_BATCH)
    assert [a.arg for a in run.args.args] == ["self", "batch", "pp_proxy_tensors"] and len(run.args.defaults) == 1
    assert self_calls(scheduler, RUN_BATCH), "the loops without PP run batches through run_batch"
    mixin = class_def(ast.parse(src["pp_mixin"]), "SchedulerPPMixin")
    for loop in ("event_loop_pp", "event_loop_pp_disagg_prefill"):
        assert self_calls(method(mixin, loop), "_pp_launch_batch"), loop
        assert not self_calls(method(mixin, loop), RUN_BATCH), loop
    launch = method(mixin, "_pp_launch_batch")
    streams = [
        w
        for w in ast.walk(launch)
        if isinstance(w, ast.With) and is_self_attr(w.items[0].context_expr, "forward_stream_ctx")
    ]
    assert len(streams) == 1 and len(self_calls(streams[0], RUN_BATCH)) == 1


@versions
def test_what_the_trace_reads_of_sglang_is_there(version):
    src = sources(version)
    batch = class_def(ast.parse(src["batch"]), "ScheduleBatch")
    fields = {n.target.id for n in batch.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert set(BATCH_FIELDS) <= fields, f"{set(BATCH_FIELDS) - fields=}"
    mode = class_def(ast.parse(src["forward_batch_info"]), "ForwardMode")
    assert method(mode, "is_extend").args.args[0].arg == "self"
    cls = class_def(ast.parse(src["scheduler"]), hook.SCHEDULER_CLASS)
    unpacked = {  # `(self.max_total_num_tokens, ..., self.device, ...) = ...`: the device comes with the worker's info
        e.attr
        for n in ast.walk(cls)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Tuple)
        for e in t.elts
        if is_self_attr(e, e.attr if isinstance(e, ast.Attribute) else "")
    }
    scheduler = assigned_self_attrs(cls) | unpacked
    assert set(SCHEDULER_FIELDS) <= scheduler, f"{set(SCHEDULER_FIELDS) - scheduler=}"
    config = assigned_self_attrs(class_def(ast.parse(src["model_config"]), "ModelConfig"))
    assert {"context_len", "dtype"} <= config
    names = {n.value for n in ast.walk(ast.parse(src["runtime_context"])) if isinstance(n, ast.Constant)}
    assert set(PARALLEL_FIELDS) <= names, f"{set(PARALLEL_FIELDS) - names=}"
