"""What every registered server provides (a new server passes these with no change here), and that no module outside
ppprof/servers branches on a server's name."""

import re
from pathlib import Path

import pytest

from ppprof.policy import from_dict
from ppprof.servers import REGISTRY, SERVERS, Server, ServerSetting, get
from ppprof.servers.export import export_data

from .helpers import PREFIX, policy_dict

PACKAGE = Path(__file__).resolve().parents[2] / "ppprof"
BENCH_STRATEGY_NAMES = ("ppprof/config/bench_config.py", "ppprof/bench/report.py")
"""Files that name the bench's `sglang` strategy (config sits below the servers, so it cannot ask the registry)."""


def test_the_registry_maps_each_name_to_its_server_and_refuses_others_in_one_line():
    assert SERVERS == ("sglang", "vllm-ascend", "atom")
    for name, server in REGISTRY.items():
        assert isinstance(server, Server) and server.name == name and get(name) is server
    with pytest.raises(ValueError) as e:
        get("trt")
    assert str(e.value) == "--server 'trt' is unknown: use one of sglang, vllm-ascend, atom"


@pytest.mark.parametrize("server", REGISTRY.values(), ids=SERVERS)
def test_flags_out_and_back_in_give_the_same_setting(server):
    for dynamic in (False, True):
        setting = ServerSetting(
            server=server.name,
            base_chunk_size=4096,
            dynamic=dynamic,
            smooth_factor=0.6,
            min_chunk_size=1024,
            max_chunk_size=4096,
            page_size=64,
        )
        calibration = PREFIX if dynamic and not server.fits_at_boot else None
        env, args = server.format_flags(setting, calibration)
        text = " ".join([f"{k}={v}" for k, v in env.items()] + [f"'{a}'" for a in args])
        back, carried, ignored = server.parse_flags(text, page_size=64)
        assert ignored == [] and back.to_dict() == setting.to_dict() | (
            {} if dynamic else {k: getattr(back, k) for k in ("smooth_factor", "min_chunk_size")}
        ), f"{back=}"
        assert carried == calibration
    assert ServerSetting.from_dict(setting.to_dict()) == setting


@pytest.mark.parametrize("server", REGISTRY.values(), ids=SERVERS)
def test_its_rule_walks_a_prompt_and_fixed_chunks_are_its_fixed_size(server):
    setting = ServerSetting(
        server=server.name,
        base_chunk_size=4096,
        dynamic=True,
        smooth_factor=0.75,
        min_chunk_size=1024,
        max_chunk_size=4096,
        page_size=64,
    )
    chunks = server.chunks(setting, server.boot_model(PREFIX), 65536, 60000)
    assert sum(chunks) == 60000 and all(isinstance(c, int) and c >= 1 for c in chunks), f"{chunks=}"
    assert chunks[0] == 4096 and len(set(chunks)) > 1, "a prefix cost shrinks the later chunks"
    fixed = server.chunks(server.fixed_candidate(2048, 64), None, 65536, 5000)
    assert fixed == [2048, 2048, 904]


@pytest.mark.parametrize("server", REGISTRY.values(), ids=SERVERS)
def test_a_setting_below_its_alignment_and_a_short_context_are_handled(server):
    align = server.alignment(64)
    with pytest.raises(ValueError) as e:
        server.check_setting(
            ServerSetting(
                server=server.name,
                base_chunk_size=align - 1,
                dynamic=False,
                smooth_factor=1.0,
                min_chunk_size=1,
                max_chunk_size=align,
                page_size=64,
            )
        )
    assert f"{server.label} " in str(e.value) and f"below the alignment {align}" in str(e.value)
    short = server.with_context(server.default_setting(64), 4096)
    assert max(short.base_chunk_size, server.fixed_chunk_size(short)) <= 4096 - server.context_margin, f"{short=}"


@pytest.mark.parametrize("server", REGISTRY.values(), ids=SERVERS)
def test_its_tune_candidates_are_its_own_settings(server):
    candidates = server.dynamic_candidates(4096, (0.5, 1.0), 64, 64)
    assert candidates and all(c.server == server.name and c.dynamic and c.base_chunk_size == 4096 for c in candidates)
    assert all(server.same_knob(c, c, 4096) for c in candidates)
    fixed = server.fixed_candidate(4096, 64)
    assert not fixed.dynamic and server.fixed_chunk_size(fixed) == 4096


@pytest.mark.parametrize("server", REGISTRY.values(), ids=SERVERS)
def test_its_export_names_it_and_says_why_it_differs(server):
    policy = from_dict(policy_dict(PREFIX, base_chunk_size=4096, context_len=32768, max_chunk_size=3000))
    data = export_data(policy, server.name)
    assert data["server"] == server.name and data["targets"] == server.targets
    assert data["causes"] and all(isinstance(c, str) and "\n" not in c for c in data["causes"])
    assert all(server.label in e for e in data["differences"]["examples"])


def test_no_module_outside_the_servers_names_a_server():
    pattern = re.compile(r"""["'](""" + "|".join(re.escape(n) for n in SERVERS) + r""")["']""")
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).as_posix()
        if relative.startswith("ppprof/servers/") or relative in BENCH_STRATEGY_NAMES:
            continue
        hits += [
            f"{relative}:{i}: {line.strip()}"
            for i, line in enumerate(path.read_text().splitlines(), 1)
            if pattern.search(line)
        ]
    assert hits == [], "ask ppprof.servers (the registry or the server's module) instead:\n" + "\n".join(hits)
