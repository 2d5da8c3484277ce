"""The TP split as shapes (ppprof.specs.tp): exact shards of real configs, replication below the TP degree, and the
one-line refusals."""

import dataclasses
from pathlib import Path

import pytest

from ppprof.specs import load_spec
from ppprof.specs.accounting import deltanet_state_shapes, kv_bytes_per_token, mamba_bytes_per_slot, mla_params
from ppprof.specs.tp import Shard, check_tp, rank_shapes, rank_spec, split_or_replicate

DATA = Path(__file__).parent / "data"


def test_llama3_8b_at_tp4_holds_8_query_heads_2_kv_heads_and_a_quarter_of_the_mlp():
    spec = load_spec("llama3-8b")
    for r in range(4):
        s = rank_shapes(spec, 4, r)
        assert s.q_heads == Shard(8 * r, 8, 32) and s.kv_heads == Shard(2 * r, 2, 8)
        assert s.intermediate == Shard(3584 * r, 3584, 14336)
        assert s.vocab == Shard(32064 * r, 32064, 128256)
        assert s.kv_head_replicas == 1


def test_kv_heads_below_the_tp_degree_are_replicated_one_a_rank():
    spec = load_spec("llama3-8b")  # 8 KV heads
    got = [rank_shapes(spec, 16, r).kv_heads for r in range(16)]
    assert [s.start for s in got] == [r // 2 for r in range(16)] and {s.size for s in got} == {1}
    assert rank_shapes(spec, 16, 0).kv_head_replicas == 2
    # each rank's query heads (2 of 32) read the KV head it holds: query head q reads KV head q // 4
    for r in range(16):
        q = rank_shapes(spec, 16, r).q_heads
        assert {h // 4 for h in range(q.start, q.stop)} == {got[r].start}, f"{r=}"


def test_mamba_groups_split_or_replicated_as_sglang():
    jamba = load_spec("jamba-mini")  # 128 heads, 1 group
    assert [rank_shapes(jamba, 4, r).mamba_groups for r in range(4)] == [Shard(0, 1, 1)] * 4
    assert rank_shapes(jamba, 4, 3).mamba_heads == Shard(96, 32, 128)
    assert split_or_replicate(8, 4, 3) == Shard(6, 2, 8) and split_or_replicate(2, 4, 3) == Shard(1, 1, 2)


def test_a_vocabulary_tp_does_not_divide_is_padded_on_the_last_rank():
    spec = dataclasses.replace(load_spec("tiny-dense"), vocab_size=509)
    assert [rank_shapes(spec, 2, r).vocab for r in range(2)] == [Shard(0, 255, 509), Shard(255, 255, 509)]


@pytest.mark.parametrize(
    "model,changes,tp,message",
    [
        (
            "tiny-dense",
            {},
            3,
            "--tp-size 3 does not divide num_attention_heads (4) of model 'tiny-dense': use a "
            "--tp-size that is a divisor of 4",
        ),
        (
            "tiny-dense",
            {"num_attention_heads": 6, "num_key_value_heads": 3},
            2,
            "does not divide num_key_value_heads (3) of model 'tiny-dense': use a --tp-size that is a divisor of 3 or a "
            "multiple of it",
        ),
        ("tiny-dense", {"intermediate_size": 130}, 4, "does not divide intermediate_size (130)"),
        ("tiny-hybrid", {"moe_intermediate_size": 66}, 4, "does not divide moe_intermediate_size (66)"),
        ("tiny-hybrid", {"mamba_num_heads": 6}, 4, "does not divide mamba_num_heads (6)"),
        (
            "tiny-hybrid",
            {
                "mamba_n_groups": 4,
                "mamba_num_heads": 12,
                "num_attention_heads": 12,
                "num_key_value_heads": 12,
                "intermediate_size": 132,
                "moe_intermediate_size": 60,
            },
            6,
            "does not divide mamba_n_groups (4)",
        ),
        ("tiny-dense", {}, 65, "--tp-size 65 must be in 1..64"),
        ("tiny-mla", {}, 8, "--tp-size 8 does not divide num_attention_heads (4) of model 'tiny-mla'"),
        ("tiny-gdn", {}, 4, "--tp-size 4 does not divide linear_num_key_heads (2) of model 'tiny-gdn'"),
        (
            "tiny-moe",
            {"shared_expert_intermediate_size": 66},
            4,
            "does not divide shared_expert_intermediate_size (66)",
        ),
    ],
)
def test_a_model_tp_cannot_split_is_refused_naming_field_value_and_fix(model, changes, tp, message):
    spec = dataclasses.replace(load_spec(model), **changes)
    with pytest.raises(ValueError) as e:
        check_tp(spec, tp)
    assert message in str(e.value), f"{e.value=}"


def test_deepseek_v3_at_tp8_splits_mla_heads_and_keeps_the_latent_whole():
    """SGLang's and vLLM's MLA TP without data-parallel attention: 16 of 128 heads a rank in q_b_proj, kv_b_proj and
    o_proj; q_a_proj and kv_a_proj whole; the latent cache (512 + 64 a token a layer) whole on every rank."""
    spec = load_spec(DATA / "deepseek_v3" / "config.json")
    check_tp(spec, 8)
    assert [rank_shapes(spec, 8, r).q_heads for r in (0, 7)] == [Shard(0, 16, 128), Shard(112, 16, 128)]
    rank = rank_spec(spec, 8, 3)
    h, heads = 7168, 16
    expected = (
        h * 1536 + 1536 + 1536 * heads * 192  # q_a, its norm, q_b: this rank's heads
        + h * 576 + 512 + 512 * heads * (128 + 128)  # kv_a (whole), its norm, kv_b: this rank's heads
        + heads * 128 * h  # o_proj: this rank's heads' rows
    )  # fmt: skip
    assert mla_params(rank) == expected, f"{mla_params(rank)=} {expected=}"
    assert kv_bytes_per_token(rank, dtype="bfloat16") == kv_bytes_per_token(spec, dtype="bfloat16") == 61 * 576 * 2


def test_qwen3_next_at_tp4_splits_deltanet_heads_and_each_rank_keeps_a_quarter_of_the_state():
    spec = load_spec(DATA / "qwen3_next" / "config.json")
    check_tp(spec, 4)
    s = rank_shapes(spec, 4, 2)
    assert s.deltanet_key_heads == Shard(8, 4, 16) and s.deltanet_value_heads == Shard(16, 8, 32)
    rank = rank_spec(spec, 4, 2)
    (conv, width), state = deltanet_state_shapes(rank)
    assert (conv, width) == ((2 * 4 * 128 + 8 * 128), 3) and state == (8, 128, 128)
    assert mamba_bytes_per_slot(rank, dtype="bfloat16") * 4 == mamba_bytes_per_slot(spec, dtype="bfloat16")


def test_every_preset_splits_at_tp_1_and_the_published_degrees_where_it_should():
    for name in ("tiny-dense", "tiny-hybrid", "llama3-8b", "jamba-mini", "nemotron-h-8b"):
        check_tp(load_spec(name), 1)
    for tp in (2, 4, 8):
        check_tp(load_spec("llama3-8b"), tp)


def test_model_tp_size_shows_one_tp_rank_of_each_stage():
    import json

    from click.testing import CliRunner

    from ppprof.cli import main

    r = CliRunner().invoke(main, ["model", "llama3-8b", "--pp-size", "2", "--tp-size", "4"])
    assert r.exit_code == 0, r.output
    assert "tp          4 ranks a stage" in r.stdout and "params      2.01G (2,007,764,992)" in r.stdout
    # KV per token on a stage: 16 layers x K and V x 2 KV heads x 128 x 2 bytes (a quarter of TP = 1's)
    row = next(line for line in r.stdout.splitlines() if line.startswith("0      0-15"))
    assert "1.00G" in row and "16.0 KiB" in row, r.stdout
    whole, per_rank = (
        json.loads(CliRunner().invoke(main, ["model", "tiny-hybrid", "--pp", "2", *tp, "--memory", "--json"]).stdout)[
            "memory"
        ]["stages"]
        for tp in ([], ["--tp-size", "2"])
    )
    assert len(per_rank) == 2 and all(b["kv_pool"] * 2 == a["kv_pool"] for a, b in zip(whole, per_rank))
    assert all(b["weights"] < a["weights"] for a, b in zip(whole, per_rank))
    r = CliRunner().invoke(main, ["model", "llama3-8b", "--tp-size", "3"])
    assert r.exit_code == 2 and "--tp-size 3 does not divide num_attention_heads (32)" in r.stderr
