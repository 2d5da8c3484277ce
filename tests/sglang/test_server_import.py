"""What a server imports is the policy contract alone (issue 47): `import ppprof.sglang.sizer` loads at most 12 of
ppprof's modules and none of numpy, PyYAML, pandas, torch or ppprof.specs (46 modules, numpy and PyYAML before, when
ppprof.policy pulled in the settings tree and the model specs); and the per-chunk answer allocates nothing but
transient scalars, keeping nothing."""

import subprocess
import sys
import tracemalloc

import pytest

from ppprof.policy.runtime import load

from .standin import REPO

MAX_MODULES = 12
HEAVY = ("numpy", "yaml", "pandas", "torch", "ppprof.specs", "ppprof.config")


def imported(statement: str) -> list[str]:
    """The modules `python -X importtime -c statement` imports, in order (each once)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement], capture_output=True, text=True, check=True
    )
    names = [line.rpartition("|")[2].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    return list(dict.fromkeys(n for n in names if n != "package"))


def test_importing_the_sizer_loads_the_contract_alone():
    names = imported("import ppprof.sglang.sizer")
    ours = [n for n in names if n == "ppprof" or n.startswith("ppprof.")]
    assert "ppprof.policy.contract" in ours and "ppprof.sglang.sizer" in ours
    assert len(ours) <= MAX_MODULES, f"{len(ours)} ppprof modules: {ours}"
    heavy = [n for n in names if any(n == h or n.startswith(h + ".") for h in HEAVY)]
    assert heavy == [], heavy


def test_loading_a_policy_and_answering_imports_nothing_heavy():
    policy = REPO / "results" / "loop-closed" / "right" / "policy.json"  # an under-load rule too
    statement = (
        "import sys, ppprof.sglang.sizer as s; p = s.load(sys.argv[1]); "
        "p.next_chunk_size(100, 50000, pending_requests=3, pending_tokens=240000)"
    )
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement, str(policy)], capture_output=True, text=True, check=True
    )
    names = {line.rpartition("|")[2].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert [n for n in names if any(n == h or n.startswith(h + ".") for h in HEAVY)] == []


def allocated(call, n: int = 2000, tries: int = 5) -> tuple[int, int]:
    """(bytes still held after `n` calls, the peak above the start) as tracemalloc counts them, the least of `tries`
    runs. tracemalloc counts every thread's allocations (the sizers' policy watches other tests started, pytest-xdist's
    channel), so the runs hold the GIL throughout: no other thread runs until the switch interval they ask for, 100 s."""
    call()
    runs, interval = [], sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        for _ in range(tries):
            tracemalloc.start()
            try:
                start, _ = tracemalloc.get_traced_memory()
                tracemalloc.reset_peak()
                for _ in range(n):
                    call()
                held, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            runs.append((held - start, peak - start))
    finally:
        sys.setswitchinterval(interval)
    return min(h for h, _ in runs), min(p for _, p in runs)


ASKS = {
    "history-only": lambda p: p.next_chunk_size(4096),
    "prompt-aware": lambda p: p.next_chunk_size(100, 50000),
    "under-load": lambda p: p.next_chunk_size(100, 50000, pending_requests=3, pending_tokens=240000),
}


@pytest.mark.parametrize("ask", ASKS.values(), ids=ASKS.keys())
def test_the_per_chunk_answer_allocates_no_more_than_its_result(ask):
    """Nothing is kept from call to call, and a call's peak is a few transient numbers (its answer, a rest, the
    under-load rule's floats) above an empty call's: no list, tuple or dict is built on the per-chunk path."""
    policy = load(REPO / "results" / "loop-closed" / "right" / "policy.json")
    assert policy.load_rule is not None
    held, peak = allocated(lambda: ask(policy))
    empty_held, empty_peak = allocated(lambda: None)
    assert held == empty_held, f"{held=} {empty_held=}"
    assert peak - empty_peak <= 128, f"{peak=} {empty_peak=}"
