"""A policy is used only on the server it fits: every mismatch is refused with one line naming the field and both
values, profile_and_fit() is False (SGLang keeps static chunks) and predict() gives None; a match logs one line."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace

import pytest

import ppprof.policy
from ppprof.bounds import POLICY_ENV
from ppprof.fit.samples import model_shape
from ppprof.policy.runtime import largest_chunk
from ppprof.policy.tables import LoadRule
from ppprof.sglang.match import ServerConfig, mismatch, model_shape_of
from ppprof.sglang.sizer import PolicySizer, agreement

from .standin import REPO, Scheduler, model_config, shaped, sizer_class

BASELINE = REPO / "results" / "baseline" / "policy.json"  # dynamic, tiny-hybrid, PP2, B 512, CPU


@pytest.fixture
def policy_path(tmp_path, monkeypatch):
    path = shaped(BASELINE, tmp_path)
    monkeypatch.setenv(POLICY_ENV, str(path))
    return path


def load(caplog, cls, config, **server):
    """profile_and_fit() on a scheduler built as SGLang's is; (result, the log lines, the sizer)."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ppprof.sglang"):
        scheduler = Scheduler(cls, config, **{"chunked_prefill_size": 512, **server})
        sizer = scheduler.maybe_init_dynamic_chunk_sizer()
    lines = [r.getMessage() for r in caplog.records if r.name == "ppprof.sglang"]
    return scheduler.dynamic_chunk_sizer is sizer, lines, sizer


def test_the_model_shape_is_what_run_json_says():
    run = json.loads((BASELINE.parent / "run.json").read_text())
    assert model_shape(run["model"]) == {
        "model_type": "nemotron_h",
        "hidden_size": 64,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
    }
    llama = json.loads((REPO / "results" / "profile-llama3-8b-2layers" / "run.json").read_text())
    assert model_shape(llama["model"])["num_hidden_layers"] == 2  # the layers the profile ran, not the full 32
    assert model_shape(None) is None and model_shape({"name": "x"}) is None


def test_a_matching_server_loads_the_policy_with_one_line(caplog, policy_path):
    kept, lines, sizer = load(caplog, sizer_class(), model_config(policy_path))
    assert kept and sizer.policy is not None
    assert len(lines) == 1 and "matches this server" in lines[0] and "\n" not in lines[0], lines
    assert f"policy {policy_path} (sha256 " in lines[0] and "pp 2, tp 1, page 1, B 512" in lines[0]
    assert sizer.predict(512) == ppprof.policy.load(policy_path).next_chunk_size(512)


def test_a_server_with_a_shorter_context_takes_the_policy_and_a_longer_one_does_not(caplog, policy_path):
    assert load(caplog, sizer_class(), model_config(policy_path, context_len=8192))[0]
    kept, lines, _ = load(caplog, sizer_class(), model_config(policy_path, context_len=65536))
    assert not kept and "context_len: server 65536, policy 32768" in lines[0]


MISMATCHES = [
    # (what differs: sizer_class, model_config and server changes, policy changes), the words of the one line
    ({"pp_size": 4}, {}, ["pp_size: the policy profiled 2 stages", "--pp-size 4"]),
    ({}, {"num_stages": 4}, ["num_stages: the policy's rules were chosen for 4 stages", "--pp 2"]),
    ({"tp_size": 2}, {"provenance.tp_size": 1}, ["tp_size: the policy profiled 1 TP ranks", "--tp-size 2"]),
    ({"page_size": 16}, {}, ["page_size: policy 1, server 16"]),
    (
        {"chunked_prefill_size": 8192},
        {},
        ["chunked_prefill_size: server 8192, policy's base_chunk_size 512", "--chunked-prefill-size 512"],
    ),
    ({"max_prefill_tokens": 256}, {}, ["max_prefill_tokens: server 256, below the policy's largest chunk"]),
    ({"context_len": 131072}, {}, ["context_len: server 131072, policy 32768"]),
    ({"model_type": "llama"}, {}, ["model model_type: policy 'nemotron_h'", "server 'llama'"]),
    ({"hidden_size": 4096}, {}, ["model hidden_size: policy 64", "server 4096"]),
    ({"num_hidden_layers": 32}, {}, ["model num_hidden_layers: policy 8", "server 32"]),
    ({"num_attention_heads": 8}, {}, ["model num_attention_heads: policy 4", "server 8"]),
    ({"num_key_value_heads": 4}, {}, ["model num_key_value_heads: policy 2", "server 4"]),
    ({"head_dim": 128}, {}, ["model head_dim: policy 16", "server 128"]),
    ({"device": "cuda"}, {}, ["device: policy profiled on cpu", "server runs on cuda"]),
    ({"device_name": "NVIDIA H200"}, {}, ["device_name: policy profiled on 'AMD EPYC'", "'NVIDIA H200'"]),
    ({}, {"provenance.model_shape": None}, ["provenance.model_shape: the policy does not record"]),
    ({}, {"table.chunk_size": [512.0]}, ["$.table.chunk_size"]),
]
RUNTIME_KEYS = ("pp_size", "tp_size", "device_name")
CONFIG_KEYS = (
    "context_len",
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


@pytest.mark.parametrize(
    "server, policy_changes, words", MISMATCHES, ids=[next(iter({**s, **p})) for s, p, _ in MISMATCHES]
)
def test_each_mismatch_is_one_line_naming_the_field_and_both_values(
    caplog, tmp_path, monkeypatch, server, policy_changes, words
):
    path = shaped(BASELINE, tmp_path, **policy_changes)
    monkeypatch.setenv(POLICY_ENV, str(path))
    config = model_config(
        shaped(BASELINE, tmp_path / "served"), **{k: v for k, v in server.items() if k in CONFIG_KEYS}
    )
    cls = sizer_class(**{k: v for k, v in server.items() if k in RUNTIME_KEYS})
    rest = {k: v for k, v in server.items() if k not in RUNTIME_KEYS + CONFIG_KEYS}
    kept, lines, sizer = load(caplog, cls, config, **rest)
    assert not kept and sizer.policy is None and sizer.predict(1024) is None
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith(f"[PP Dynamic Chunk] ppprof policy {path} refused, static chunks of "), lines[0]
    assert all(w in lines[0] for w in words), (words, lines[0])


def test_no_policy_named_or_none_there_is_one_line_too(caplog, tmp_path, monkeypatch, policy_path):
    config = model_config(policy_path)
    monkeypatch.delenv(POLICY_ENV)
    kept, lines, _ = load(caplog, sizer_class(), config)
    assert not kept and len(lines) == 1 and "PPPROF_POLICY is not set" in lines[0]
    monkeypatch.setenv(POLICY_ENV, str(tmp_path / "none.json"))
    kept, lines, _ = load(caplog, sizer_class(), config)
    assert not kept and len(lines) == 1 and "none.json is not readable" in lines[0], lines


def test_every_rank_refuses_when_one_rank_refuses_or_reads_another_file(caplog, tmp_path, policy_path):
    config = model_config(policy_path)
    own = sizer_class()(
        model_runner=None,
        model_config=config,
        tree_cache=None,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=None,
        spec_algorithm=None,
        chunked_prefill_size=512,
        max_prefill_tokens=16384,
        page_size=1,
        device="cpu",
    )
    runtime = own.runtime("cpu")
    other_path = shaped(BASELINE, tmp_path / "other", **{"reason": "another fit of the same samples"})
    _, _, other_digest = own.check(str(other_path), runtime)
    _, refused, digest = own.check(str(shaped(BASELINE, tmp_path / "bad", **{"provenance.world_size": 4})), runtime)
    kept, lines, _ = load(caplog, sizer_class(others=[(refused, digest)]), config)
    assert not kept and lines[0].endswith(f"rank 1: {refused}"), lines
    kept, lines, _ = load(caplog, sizer_class(others=[(None, other_digest)]), config)
    assert not kept and "the ranks read different policy files" in lines[0], lines
    assert agreement([(None, "a" * 64), (None, "a" * 64)]) is None


def test_outside_sglang_the_runtime_is_not_readable_and_nothing_is_raised(caplog, policy_path):
    # SGLang's parallel state is published only inside its server: without it (or without sglang) no policy.
    kept, lines, _ = load(caplog, PolicySizer, model_config(policy_path))
    assert not kept and len(lines) == 1 and "SGLang's parallel state is not readable" in lines[0], lines


def test_the_checks_read_sglangs_model_config_fields(policy_path):
    policy = ppprof.policy.load(policy_path)
    config = model_config(policy_path)
    server = ServerConfig(
        pp_size=2,
        tp_size=1,
        page_size=1,
        chunked_prefill_size=512,
        max_prefill_tokens=16384,
        context_len=config.context_len,
        device="cpu",
        device_name=None,
        model_shape=model_shape_of(config),
    )
    assert mismatch(policy, server) is None
    assert largest_chunk(policy) >= max(policy.data["table"]["chunk_size"])
    wide = replace(policy, load_rule=LoadRule(2, 1.0, 64, math.inf, 4 * largest_chunk(policy)))
    assert largest_chunk(wide) == wide.load_rule.chunk_cap  # the under-load rule's cap too
    unknown = ServerConfig(
        pp_size=None,
        tp_size=None,
        page_size=1,
        chunked_prefill_size=512,
        max_prefill_tokens=largest_chunk(policy),
        context_len=None,
        device="cpu:0",
        device_name=None,
        model_shape=model_shape_of(config),
    )
    assert mismatch(policy, unknown) is None  # what the server does not say is not held against it
    data = json.loads(policy_path.read_text())
    del data["provenance"]["tp_size"]  # fitted before TP: the server's TP size is not held against it
    before_tp = policy_path.parent / "before-tp.json"
    before_tp.write_text(json.dumps(data))
    assert mismatch(ppprof.policy.load(before_tp), replace(server, tp_size=4)) is None


def test_fit_records_the_model_shape_and_the_schema_takes_it(tmp_path):
    import shutil

    from ppprof.fit import fit

    for name in ("samples.csv", "run.json"):
        shutil.copy(BASELINE.parent / name, tmp_path / name)
    path, data = fit(tmp_path / "samples.csv", policy_options={"load_rule": False})
    assert data["report"]["provenance"]["model_shape"] == model_shape(
        json.loads((tmp_path / "run.json").read_text())["model"]
    )
    assert ppprof.policy.load(path).report.provenance["model_shape"]["model_type"] == "nemotron_h"
    bad = json.loads(path.read_text())
    bad["report"]["provenance"]["model_shape"]["hidden_size"] = 0
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"\$\.report\.provenance\.model_shape\.hidden_size"):
        ppprof.policy.load(tmp_path / "bad.json")
