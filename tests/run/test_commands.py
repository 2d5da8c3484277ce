"""Input checks of `ppprof profile`: one line, exit code 2, nothing written, before any rank starts."""

import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.run.resolve import resolve_config


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "no-such-model"], "no-such-model"),
        (["--model", "tiny-dense", "--nproc-per-node", "9"], "number of stages (9) cannot be greater than layers"),
        (["--requests-per-probe", "200"], "--requests-per-probe 200 must be an integer in 8..128"),
        (["--requests-per-probe", "4"], "--requests-per-probe 4 must be an integer in 8..128"),
        (["--max-total-tokens", "256"], "does not fit the KV cache"),
        (["--layer-partition", "3,3"], "--layer-partition 3,3 adds up to 6 layers but the model has 8"),
        (["--layer-partition", "8,0"], "would leave a stage empty"),
        (["--nnodes", "1:4"], "--nnodes '1:4' must be a fixed node count"),
        (["--bogus"], "No such option '--bogus'"),
        (["--dtype", "int8"], "--dtype: dtype 'int8' is not supported: use one of float32, bfloat16, float16"),
        (["--attention-backend", "flashinfer"], "--attention-backend flashinfer runs on CUDA only"),
        (["--attention-backend", "fast"], "Invalid value for '--attention-backend'"),
        (["--device", "cuda", "--start-method", "fork"], "--start-method fork cannot be used with --device cuda"),
        (["--design", "random"], "Invalid value for '--design'"),
        (
            ["--design", "grid", "--max-requests", "100"],
            "--max-requests 100 bounds the adaptive design only (the default): drop --design grid or drop --max-requests",
        ),
        (["--design", "grid", "--max-seconds", "5"], "--max-seconds 5.0 bounds the adaptive design only"),
        (["--max-requests", "5"], "--max-requests 5 is below the 12 requests of the adaptive"),  # the default design
        (["--design", "adaptive", "--max-requests", "0"], "--max-requests 0 must be an integer in 1..1000000"),
        (["--design", "adaptive", "--max-seconds", "-1"], "--max-seconds -1.0 must be a positive number of seconds"),
        (
            ["--design", "adaptive", "--prefix-lens", "512"],
            "the adaptive design (the default) with --prefix-lens 512: the candidate grid has 2 prefix lengths",
        ),
        (
            ["--prefix-lens", "512"],
            "or leave --prefix-lens out for the default ones, or probe these with --design grid",
        ),  # the default
        (["--prefix-lens", "512", "--dry-run"], "the candidate grid has 2 prefix lengths"),  # as the run refuses it
        (
            ["--design", "adaptive", "--base-chunk-size", "32"],
            "--base-chunk-size 32 is below the chunk alignment 64 = max(--page-size 1, 64)",
        ),
        (
            ["--base-chunk-size", "32"],
            "--base-chunk-size 32 is below the chunk alignment 64 = max(--page-size 1, 64) "
            "that dynamic chunks are multiples of: use --base-chunk-size 64 or more",
        ),
        (
            ["--base-chunk-size", "32", "--no-fit"],
            "use --base-chunk-size 64 or more (the adaptive design plans them; --design grid probes a smaller B)",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["profile", "--out", str(out), *args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ")
    assert "Traceback" not in r.output
    assert not out.exists()


def test_yaml_config_is_read_and_flags_win(tmp_path):
    cfg_file = tmp_path / "p.yaml"
    cfg_file.write_text(
        "model: tiny-dense\nbase-chunk-size: 256\nlayer_partition: 1,3\nprefix_lens: [256, 512]\ndtype: bf16\n"
    )
    cfg = resolve_config(str(cfg_file), {"base_chunk_size": 128, "seed": None})
    assert cfg.model.model == "tiny-dense"
    assert cfg.probes.base_chunk_size == 128
    assert cfg.parallelism.layer_partition == (1, 3)
    assert cfg.probes.prefix_lens == (256, 512)
    assert cfg.model.dtype == "bfloat16"


def test_yaml_with_an_unknown_key_is_refused(tmp_path):
    cfg_file = tmp_path / "p.yaml"
    cfg_file.write_text("base_chunk: 256\n")
    r = CliRunner().invoke(main, ["profile", "--config", str(cfg_file)])
    assert r.exit_code == 2
    assert "unknown setting 'base_chunk'" in r.stderr


def test_shipped_config_files_resolve():
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[2] / "configs").glob("profile-*.yaml")):
        cfg = resolve_config(str(path), {})
        assert cfg.probes.requests_per_probe <= 128, path


def test_an_output_folder_that_cannot_be_written_is_refused_before_any_rank(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = CliRunner().invoke(main, ["profile", "--out", str(blocker / "run")])
    assert r.exit_code == 2
    assert r.stderr.startswith(f"error: --out {blocker / 'run'}: {blocker} is not a writable folder")
    r = CliRunner().invoke(main, ["profile", "--out", str(blocker)])
    assert r.exit_code == 2 and "exists and is not a folder" in r.stderr


def test_cli_turns_an_unwritable_output_into_one_line(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("")
    samples = tmp_path / "s.csv"
    samples.write_text(
        "prefix_len,chunk_size,latency_ms\n" + "".join(f"0,{c},{1 + c * 0.01}\n" for c in range(1, 200, 5))
    )
    r = CliRunner().invoke(main, ["fit", str(samples), "--base-chunk-size", "128", "-o", str(blocker / "p.json")])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: cannot use {blocker / 'p.json'}: ") and r.stderr.count("\n") == 1


def test_a_mamba_cache_below_the_probe_size_is_warned_about():
    from ppprof.config import ProfileConfig
    from ppprof.run.prelaunch import warnings

    assert warnings(ProfileConfig()) == []
    (line,) = warnings(ProfileConfig(max_mamba_cache_size=64))
    assert "--max-mamba-cache-size 64 is below --requests-per-probe 128" in line and "raise it to 128" in line


# Memory checked before launch (ppprof.run.memory_check: profile_memory, memory_verdict, check_memory; `model --memory`).


def test_a_profile_too_big_for_this_host_is_refused_before_any_rank(tmp_path):
    """Llama-3-8B over 2 CPU ranks in fp32 with 8M KV slots a stage: about 1 TiB of KV a stage, refused on any host
    with less than 2 TiB available, in one line naming the stages, the estimate, the limit and the fix."""
    from ppprof.run.memory_check import host_available_bytes

    if host_available_bytes() is None:
        pytest.skip("no /proc/meminfo: the host check is skipped here, and the profile would start")
    out = tmp_path / "run"
    r = CliRunner().invoke(
        main,
        [
            "profile",
            "--model",
            "llama3-8b",
            "--dtype",
            "fp32",
            "--nproc-per-node",
            "2",
            "--prefix-lens",
            "512,1024,2048",
            "--max-total-tokens",
            str(8 * 2**20),
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: stages 0-1 of this host need ~2.0 TiB (")
    for needle in (
        "KV 1.0 TiB",
        "at chunk 2048 after 2048 tokens",
        "available (MemAvailable)",
        ": lower --max-total-tokens (the probes need 4096), fewer/shorter --prefix-lens, keep fewer layers "
        "(--num-layers), use --dtype bfloat16, or spread the stages over more hosts",
    ):
        assert needle in r.stderr, needle
    assert not out.exists()


def fake_limits(monkeypatch, *, host=None, gpus=None):
    import ppprof.run.memory_check as options

    monkeypatch.setattr(options, "host_available_bytes", lambda: host)
    monkeypatch.setattr(options, "gpu_total_bytes", lambda count: gpus)


def test_cpu_stages_of_one_host_are_checked_together_against_its_available_memory(monkeypatch):
    from ppprof.config import ProfileConfig
    from ppprof.run.memory_check import check_memory, memory_verdict, profile_memory

    cfg = ProfileConfig(model="tiny-hybrid", nproc_per_node=2)
    stages = profile_memory(cfg, 4)
    need = stages[2].total + stages[3].total
    fake_limits(monkeypatch, host=need)
    assert memory_verdict(cfg, stages, 2, range(2, 4)).problem is None
    fake_limits(monkeypatch, host=need - 1)
    verdict = memory_verdict(cfg, stages, 2, range(2, 4))
    assert verdict.checked and verdict.problem.startswith("stages 2-3 of this host need ~")
    # Nodes unknown (c10d rendezvous): the largest stage x the local ranks.
    largest = max(s.total for s in stages)
    fake_limits(monkeypatch, host=2 * largest - 1)
    assert memory_verdict(cfg, stages, 2, None).problem.startswith("the 2 stages of this host need up to ~")
    fake_limits(monkeypatch, host=None)  # no /proc/meminfo: not checked, no error
    assert memory_verdict(cfg, stages, 2, range(2)).checked is False
    check_memory(cfg, 2, 2)


def test_each_cuda_stage_is_checked_against_its_gpu(monkeypatch):
    import ppprof.specs.memory as memory
    from ppprof.config import ProfileConfig
    from ppprof.run.memory_check import memory_verdict, profile_memory

    monkeypatch.setattr(memory, "mamba_kernel", lambda device: memory.MAMBA_TORCH)  # also where mamba_ssm is installed
    cfg = ProfileConfig(
        model="nemotron-h-8b",
        device="cuda",
        nproc_per_node=4,
        base_chunk_size=8192,
        page_size=64,
        prefix_lens=(8192, 32768, 65536),
        context_len=131072,
        attention_backend="sdpa",
    )
    stages = profile_memory(cfg, 4)
    fake_limits(monkeypatch, gpus=[80 * 2**30] * 4)
    assert memory_verdict(cfg, stages, 4, range(4)).problem is None
    fake_limits(monkeypatch, gpus=[80 * 2**30, 8 * 2**30, 80 * 2**30, 80 * 2**30])
    problem = memory_verdict(cfg, stages, 4, range(4)).problem
    # the largest probe request: a 4 B chunk (32768 tokens) after the longest prefix
    assert problem.startswith(
        "stage 1 needs ~19.1 GiB (weights 3.3 GiB, KV 384.2 MiB, Mamba 3.1 GiB, requests "
        "128.0 MiB, activations 12.3 GiB at chunk 32768 after 65536 tokens) but its GPU (cuda:1) "
        "has 8.0 GiB: "
    ), problem
    assert "lower --base-chunk-size" in problem and "use more stages (--nproc-per-node)" in problem
    fake_limits(monkeypatch, gpus=None)
    assert memory_verdict(cfg, stages, 4, range(4)).checked is False


def test_the_stages_of_this_node(monkeypatch):
    from ppprof.run.memory_check import node_stages

    for key in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert node_stages(4, 4, {}) == range(4)
    assert node_stages(8, 4, {"node_rank": "1"}) == range(4, 8)
    assert node_stages(8, 4, {"node_rank": "1", "rdzv_backend": "c10d"}) is None
    monkeypatch.setenv("RANK", "6")
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert node_stages(8, 4, {"rdzv_backend": "c10d"}) == range(4, 8)


def test_host_available_bytes_reads_meminfo(tmp_path):
    from ppprof.run.memory_check import host_available_bytes

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684092 kB\nMemFree:  100 kB\nMemAvailable:   23266540 kB\n")
    assert host_available_bytes(meminfo) == 23266540 * 1024
    assert host_available_bytes(tmp_path / "missing") is None


def model_memory(*args):
    """`ppprof model` as ppprof/cli.py registers it (ppprof.commands.model)."""
    from ppprof.cli import main

    return CliRunner().invoke(main, ["model", *args])


def test_model_memory_prints_each_stage_and_the_limit():
    r = model_memory("tiny-hybrid", "--memory", "--base-chunk-size", "256", "--prefix-lens", "256,512,1024")
    assert r.exit_code == 0, r.output
    assert "stage  layers  params" in r.stdout, "the model's own table comes first"
    assert "chunk 1024 after 1024 cached tokens; float32 on cpu, attention sdpa, mamba torch SSD" in r.stdout
    import re

    table = re.search(
        r"^stage +weights +init draws +KV pool +Mamba pool +requests +activations +total +peak in$(.*?)^$",
        r.stdout,
        re.M | re.S,
    )
    assert table, r.stdout
    assert len([line for line in table.group(1).splitlines() if line[:1].isdigit()]) == 2
    assert "limit       " in r.stdout and ("check       fits" in r.stdout or "not checked here" in r.stdout)


def test_model_memory_json_and_the_shipped_gpu_config():
    import json
    from pathlib import Path

    config = Path(__file__).resolve().parents[2] / "configs" / "profile-nemotron-h-8b-gpu.yaml"
    r = model_memory("nemotron-h-8b", "--memory", "--config", str(config), "--attention-backend", "sdpa", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["name"] == "nemotron-h-8b" and len(d["stages"]) == 4
    memory = d["memory"]
    assert memory["settings"]["base_chunk_size"] == 8192 and memory["settings"]["prefix_lens"] == [8192, 32768, 65536]
    assert [s["stage_idx"] for s in memory["stages"]] == [0, 1, 2, 3]
    for s in memory["stages"]:
        assert (s["dtype"], s["device"], s["chunk_size"], s["prefix_len"]) == ("bfloat16", "cuda", 32768, 65536)
        assert s["total"] == sum(s[k] for k in ("weights", "kv_pool", "mamba_pool", "request_table", "activation_peak"))
    # --pp wins over the config's nproc_per_node.
    assert (
        len(
            json.loads(
                model_memory("nemotron-h-8b", "--memory", "--config", str(config), "--pp", "2", "--json").stdout
            )["memory"]["stages"]
        )
        == 2
    )


def test_model_without_memory_is_unchanged_and_refuses_the_sizing_options():
    r = model_memory("tiny-dense", "--json")
    assert r.exit_code == 0 and "memory" not in r.stdout
    r = model_memory("tiny-dense", "--base-chunk-size", "256")
    assert r.exit_code == 2
    assert r.stderr == "error: --base-chunk-size sizes the memory table only: add --memory\n"
    r = model_memory("tiny-dense", "--memory", "--base-chunk-size", "100000")
    assert r.exit_code == 2 and "exceeds --context-len 32768" in r.stderr
