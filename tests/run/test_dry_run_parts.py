"""The dry run's parts: the live-bytes count of a forward on meta tensors, the recording TP group, the worst-case
routing answer, --device-memory, the layout search, and `ppprof profile --dry-run` through the command group."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.run.dry_report import SEARCHED_TP_SIZES, layout_need, parse_device_memory, smallest_layout
from ppprof.run.meta_forward import (
    ALL_GATHER,
    ALL_REDUCE,
    SEND,
    LiveBytes,
    RecordingTP,
    record_receive,
    record_send,
    summarize,
    worst_bincount,
)
from ppprof.run.resolve import resolve_config
from ppprof.specs import load_spec

MIB = 2**20
REPO = Path(__file__).resolve().parents[2]


def test_live_bytes_counts_new_tensors_while_they_live_and_their_peak():
    weight = torch.empty((256, 256), device="meta")  # before: not counted
    with LiveBytes() as live:
        x = torch.empty((MIB // 4,), device="meta")  # 1 MiB of fp32
        y = x * 2  # 1 MiB more
        y.add_(1)  # in place: nothing new
        v = y[:10]  # a view: nothing new
        del x
        z = weight @ weight  # 256 KiB
        assert live.live == MIB + 256 * 1024, f"{live.live=}"
        del y, v, z
    assert live.peak == 2 * MIB and live.live == 0, f"{live.peak=} {live.live=}"


def test_worst_bincount_puts_every_token_on_the_first_top_k_experts():
    with LiveBytes(top_k=2):
        counts = torch.bincount(torch.empty(12, dtype=torch.int64, device="meta"), minlength=5)
    assert counts.tolist() == [6, 6, 0, 0, 0]
    assert worst_bincount(torch.empty(8, dtype=torch.int64), 0, 4).tolist() == [2, 2, 2, 2]


def test_recording_tp_keeps_shapes_and_counts_bytes():
    tp = RecordingTP(4, 1)
    x = torch.empty((3, 8), dtype=torch.bfloat16, device="meta")
    assert tp.all_reduce(x) is x
    assert tp.all_gather(x).shape == (12, 8)
    assert summarize(tp.calls) == {ALL_REDUCE: {"count": 1, "bytes": 48}, ALL_GATHER: {"count": 1, "bytes": 192}}
    calls = []
    record_send(calls, x, x, 4)  # 24 values: 1/4 each of hidden and residual, after the 16-byte header
    record_receive(calls, x, 4)  # the next stage all-gathers both
    record_send(calls, x[:1], x[:1], 3)  # 8 values: tp 3 does not divide them, they cross whole
    assert [(c.kind, c.nbytes) for c in calls] == [(SEND, 16 + 24), (ALL_GATHER, 48), (ALL_GATHER, 48), (SEND, 48)]
    one = RecordingTP(1, 0)
    assert one.all_gather(x) is x and one.all_reduce(x) is x and one.calls == []


@pytest.mark.parametrize(
    "text,expected", [("80GiB", 80 * 2**30), ("141 GB", 141 * 10**9), ("1.5TiB", int(1.5 * 2**40)), ("4096", 4096)]
)
def test_parse_device_memory(text, expected):
    assert parse_device_memory(text) == expected


@pytest.mark.parametrize("text", ["80XB", "-5GiB", "", "0", "GiB", "80 GiB GiB"])
def test_parse_device_memory_refuses_what_is_not_a_size(text):
    with pytest.raises(ValueError, match="--device-memory"):
        parse_device_memory(text)


def test_smallest_layout_has_the_fewest_gpus_of_those_that_fit():
    cfg = resolve_config(None, {"model": "llama3-8b", "pp_size": 1, "dtype": "bf16"})
    spec = load_spec("llama3-8b", dtype="bfloat16")
    limit = 6 * 2**30
    pp, tp, need = smallest_layout(cfg, spec, limit)
    assert need <= limit and need == layout_need(cfg, spec, pp, tp)
    for p in range(1, spec.num_layers + 1):
        for t in SEARCHED_TP_SIZES:
            if p * t < pp * tp:
                fewer = layout_need(cfg, spec, p, t)
                assert fewer is None or fewer > limit, f"{p=} {t=} {fewer=}"


def dry(*args):
    return CliRunner().invoke(main, ["profile", "--dry-run", "--model", "llama3-8b", "--dtype", "bf16", *args])


def test_cli_table_and_json():
    r = dry("--pp-size", "2", "--tp-size", "2", "--num-layers", "4")
    assert r.exit_code == 0, r.output
    assert "PP2 x TP2: 4 ranks built on meta tensors" in r.stdout and "all_reduce" in r.stdout
    r = dry("--pp-size", "2", "--tp-size", "2", "--num-layers", "4", "--json", "--device-memory", "80GiB")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert [x["rank"] for x in d["ranks"]] == [0, 1, 2, 3] and d["fits"] is True and d["device_memory"] == 80 * 2**30
    assert d["ranks"][0]["collectives"]["send"]["count"] == 1


def test_cli_refuses_a_layout_that_does_not_fit_in_one_line_naming_the_rank_and_a_layout_that_fits():
    r = dry("--pp-size", "1", "--device-memory", "8GiB")
    assert r.exit_code == 2, r.output
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in r.output
    assert "rank 0 (stage 0, TP rank 0)" in line and "the smallest layout that fits is --pp-size" in line, line


@pytest.mark.parametrize("args,setting", [(("--device-memory", "80GiB"), "--device-memory"), (("--json",), "--json")])
def test_cli_dry_run_flags_need_dry_run(args, setting):
    r = CliRunner().invoke(main, ["profile", *args])
    assert r.exit_code == 2 and setting in r.stderr and "--dry-run" in r.stderr, r.output


def test_the_gpu_check_dry_runs_deepseek_v3_at_pp4_tp8_with_flags_profile_takes():
    script = (REPO / "scripts" / "gpu_check.sh").read_text()
    block = script[script.index("ppprof profile --dry-run") : script.index('> "$out/dry-run-deepseek-v3.txt"')]
    command = " ".join(block.replace("\\\n", " ").split())
    assert "--model tests/specs/data/deepseek_v3/config.json --pp-size 4 --tp-size 8" in command, command
    known = {o for p in main.commands["profile"].params for o in p.opts}
    assert set(re.findall(r"--[a-z][a-z0-9-]*", command)) <= known, command
