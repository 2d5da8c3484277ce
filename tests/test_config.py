"""Profile settings: checks at construction, resolved defaults, and the sweep's chunk sizes."""

import pytest

from ppprof.chunks import align_down
from ppprof.config import ProfileConfig, sweep_chunk_sizes


def test_sweep_matches_the_linear_fall_of_sglang():
    # size_i = int(1.25 B - i * (1.25 B // 128)) for B = 8192: 10240, 10160, ..., 80
    sizes = sweep_chunk_sizes(8192, 128, 1)
    assert sizes[:3] == [10240, 10160, 10080]
    assert sizes[-1] == 10240 - 127 * 80
    assert all(a > b for a, b in zip(sizes, sizes[1:]))


def test_sweep_is_aligned_and_never_below_one_unit():
    sizes = sweep_chunk_sizes(512, 128, 64)
    assert all(s % 64 == 0 and s >= 64 for s in sizes), f"{sizes=}"
    assert sizes[0] == 640
    assert align_down(5, 64) == 64


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("requests_per_probe", 129, "--requests-per-probe 129 must be an integer in 8..128"),
        ("requests_per_probe", 7, "--requests-per-probe 7 must be an integer in 8..128"),
        (
            "max_total_tokens",
            100,
            "--base-chunk-size 512 does not fit the KV cache: the longest probe request needs 32768",
        ),
        ("device", "tpu", "--device 'tpu' is not supported"),
        ("page_size", 0, "--page-size 0 must be an integer in 1.."),
        ("context_len", 600, "exceeds --context-len 600"),
        ("max_probe_chunk_multiple", 1.0, r"--max-probe-chunk-multiple 1.0 must be a number in 1.25..16"),
        ("max_probe_chunk_multiple", 17, r"--max-probe-chunk-multiple 17 must be a number in 1.25..16"),
        ("max_probe_chunk_multiple", "4", r"--max-probe-chunk-multiple '4' must be a number"),
        ("max_probe_chunk_multiple", True, r"--max-probe-chunk-multiple True must be a number"),
        ("overhead_repeats", -1, "--overhead-repeats -1 must be an integer in 0..100"),
        ("overhead_repeats", 3.0, "--overhead-repeats 3.0 must be an integer"),
    ],
)
def test_bad_settings_name_the_field_and_value(field, value, match):
    with pytest.raises(ValueError, match=match):
        ProfileConfig(**{field: value})


def test_sweep_reaches_about_b_over_128_whatever_the_number_of_requests():
    for n in (8, 16, 128):
        sizes = sweep_chunk_sizes(8192, n, 1)
        assert sizes[0] == 10240 and sizes[-1] == 80, f"{n=} {sizes[-3:]=}"
        assert len(sizes) == n


def test_with_128_requests_the_sweep_is_exactly_sglangs_for_every_base_chunk():
    for B in range(103, 20000, 7):
        top = int(1.25 * B)
        assert sweep_chunk_sizes(B, 128) == [int(1.25 * B - i * (top // 128)) for i in range(128)], f"{B=}"


def test_max_total_tokens_defaults_to_the_longest_probe_request_in_whole_pages():
    cfg = ProfileConfig(base_chunk_size=512, page_size=16)
    assert cfg.pools.max_total_tokens == cfg.needed_total_tokens() == 32768
    assert cfg.to_dict()["max_total_tokens"] == cfg.pools.max_total_tokens
    assert ProfileConfig(**cfg.to_dict()).to_dict() == cfg.to_dict()


def test_default_prefix_lengths_span_the_context_log_spaced_on_the_page():
    cfg = ProfileConfig(base_chunk_size=8192, page_size=64, context_len=131072)
    lens = cfg.resolved_prefix_lens()
    assert lens[0] == 8192 and lens[-1] == 131072 - 4 * 8192 and len(lens) == 6  # less the largest probe chunk
    assert all(p % 64 == 0 for p in lens) and list(lens) == sorted(set(lens))
    ratios = [b / a for a, b in zip(lens, lens[1:])]
    assert max(ratios) / min(ratios) < 1.01, f"{ratios=}"
    assert ProfileConfig(num_prefix_lens=1).resolved_prefix_lens() == (32768 - 2048,)
    assert ProfileConfig(prefix_lens=(100,)).resolved_prefix_lens() == (100,)


def test_design_settings_are_checked():
    import pytest

    from ppprof.config import ProfileConfig

    assert ProfileConfig().probes.design == "adaptive"
    with pytest.raises(ValueError, match="--design 'dense' is unknown: use one of grid, adaptive"):
        ProfileConfig(design="dense")
    with pytest.raises(ValueError, match="--max-requests 64 bounds the adaptive design only"):
        ProfileConfig(max_requests=64, design="grid")
    assert ProfileConfig(max_requests=64).request_budget == 64  # the default design takes it
    with pytest.raises(ValueError, match="--max-seconds 0 must be a positive number"):
        ProfileConfig(design="adaptive", max_seconds=0)
    cfg = ProfileConfig(design="adaptive", requests_per_probe=64, max_seconds=3)
    assert cfg.probes.max_seconds == 3.0 and cfg.request_budget == 64 * 7  # the grid's requests by default
    assert ProfileConfig(design="adaptive", max_requests=100).request_budget == 100


def test_recorded_settings_are_read_back_typed_and_checked():
    cfg = ProfileConfig(base_chunk_size=1024, page_size=16, prefix_lens=(1024, 4096), layer_partition=(3, 5))
    recorded = {**cfg.to_dict(), "retired_setting": 1}  # a key of another ppprof version is left out
    assert ProfileConfig.from_dict(recorded) == cfg
    with pytest.raises(ValueError, match=r"^run.json here: --page-size 0 must be an integer"):
        ProfileConfig.from_dict({**cfg.to_dict(), "page_size": 0}, "run.json here")


def test_a_config_recorded_before_the_design_was_a_setting_reads_as_the_grid():
    """Such a run ran the grid, the only design then; read with today's default it would resume as adaptive, and a
    B below the alignment with --no-fit would not read at all."""
    old = ProfileConfig(base_chunk_size=32, fit=False, design="grid").to_dict()
    del old["design"]
    assert ProfileConfig.from_dict(old).probes.design == "grid"
    assert ProfileConfig.from_dict(ProfileConfig(base_chunk_size=64).to_dict()).probes.design == "adaptive"


def test_a_config_recorded_before_the_largest_probe_chunk_was_a_setting_reads_as_1_25b():
    cfg = ProfileConfig(base_chunk_size=512)
    assert cfg.probes.max_probe_chunk_multiple == 4.0 and cfg.max_probe_chunk_size == 2048
    assert cfg.to_dict()["max_probe_chunk_multiple"] == 4.0 and cfg.to_dict()["overhead_repeats"] == 3
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("max_probe_chunk_multiple", "overhead_repeats")}
    old["prefix_lens"] = [512, 32128]  # the deepest prefix of a run that probed up to 1.25 B: 32128 + 2048 > 32768
    read = ProfileConfig.from_dict(old)
    assert read.probes.max_probe_chunk_multiple == 1.25 and read.max_probe_chunk_size == 640, f"{read=}"
    new = ProfileConfig(base_chunk_size=512, prefix_lens=(512, 4096), overhead_repeats=0)
    assert ProfileConfig.from_dict(new.to_dict()) == new  # a config that records the setting keeps it
    assert (
        ProfileConfig(max_probe_chunk_multiple=3).probes.max_probe_chunk_multiple == 3.0
    )  # a YAML integer is a number


def test_the_rule_settings_of_a_profile_and_their_overrides():
    cfg = ProfileConfig(base_chunk_size=1024, page_size=128, context_len=65536)
    s = cfg.chunk_settings()
    assert (s.base_chunk_size, s.page_size, s.context_len, s.alignment, s.min_chunk_size) == (
        1024,
        128,
        65536,
        128,
        256,
    )
    assert cfg.chunk_settings(smooth_factor=0.5, page_size=None).smooth_factor == 0.5  # None: not given


def test_a_base_chunk_below_the_alignment_is_refused_only_where_a_rule_is_needed():
    message = r"--base-chunk-size 32 is below the chunk alignment 64 = max\(--page-size 1, 64\)"
    with pytest.raises(ValueError, match=message):
        ProfileConfig(base_chunk_size=32)
    # without the fit, the default adaptive design still plans dynamic chunks, and says how to profile samples alone
    with pytest.raises(
        ValueError, match=message + r".* \(the adaptive design plans them; --design grid probes a smaller B\)$"
    ):
        ProfileConfig(base_chunk_size=32, fit=False)
    grid = ProfileConfig(base_chunk_size=32, fit=False, design="grid")  # samples only: no rule to check
    assert grid.probes.base_chunk_size == 32
    # a B the grid refuses too (below the unit every probe chunk splits over the TP ranks in) gets no such hint
    with pytest.raises(
        ValueError, match=r"--base-chunk-size 20 is smaller than 48 = lcm\(--page-size 16, --tp-size 6\)"
    ) as e:
        ProfileConfig(base_chunk_size=20, page_size=16, tp_size=6, pp_size=1, fit=False)
    assert "--design grid" not in str(e.value)


def test_chunks_split_evenly_over_the_tp_ranks():
    """At a TP degree that does not divide the page or 64, every probe chunk is a multiple of lcm(page, tp) and the
    rule's chunks of lcm(max(page, 64), tp); a base chunk or an --alignment that cannot split so is refused. At TP
    degrees that divide 64 nothing changes."""
    from ppprof.probe.synth import make_probes

    cfg = ProfileConfig(
        base_chunk_size=768, tp_size=3, pp_size=1, prefix_lens=(768, 4096), requests_per_probe=16, overhead_repeats=0
    )
    assert cfg.chunk_unit == 3 and cfg.chunk_settings().alignment == 192
    sizes = {r.chunk_size for p in make_probes(cfg) for r in p.requests}
    assert sizes and all(x % 3 == 0 for x in sizes) and cfg.max_probe_chunk_size % 3 == 0
    paged = ProfileConfig(base_chunk_size=768, page_size=16, tp_size=6, pp_size=1, overhead_repeats=0)
    assert paged.chunk_unit == 48 and paged.chunk_settings().alignment == 192
    assert ProfileConfig(base_chunk_size=512, tp_size=4, pp_size=1).chunk_settings().alignment == 64
    assert ProfileConfig(base_chunk_size=512, tp_size=4, pp_size=1).chunk_unit == 4
    with pytest.raises(
        ValueError,
        match=r"--base-chunk-size 128 is below the chunk alignment 192 = "
        r"lcm\(max\(--page-size 1, 64\), --tp-size 3\)",
    ):
        ProfileConfig(base_chunk_size=128, tp_size=3, pp_size=1)
    with pytest.raises(
        ValueError, match=r"--base-chunk-size 20 is smaller than 48 = lcm\(--page-size 16, --tp-size 6\)"
    ):
        ProfileConfig(base_chunk_size=20, page_size=16, tp_size=6, pp_size=1, fit=False)
    with pytest.raises(ValueError, match="--alignment 64 is not a multiple of the profile's --tp-size 3"):
        cfg.chunk_settings(alignment=64)
    assert cfg.chunk_settings(alignment=96).alignment == 96


def test_profile_help_shows_the_settings_trees_defaults():
    import re

    from ppprof.cli import main

    helps = {p.name: p.help or "" for p in main.commands["profile"].params}
    checked = 0
    from ppprof.config.sections import setting_fields

    for f in setting_fields():
        if f.default is None or isinstance(f.default, bool) or f.name not in helps:
            continue
        shown = re.findall(r"\[([^\]]+)\]$", helps[f.name])
        expected = f"{f.default:g}" if isinstance(f.default, float) else str(f.default)
        assert shown == [expected], (f.name, helps[f.name])
        checked += 1
    assert checked >= 12


def test_the_base_chunk_is_checked_against_its_units_in_one_place():
    """config/chunk.py's check_base_chunk is the one place that compares B with a unit (pages, TP ranks, alignment):
    no other settings module does."""
    import inspect

    import ppprof.config.chunk as chunk
    import ppprof.config.profile_config as profile

    assert "check_base_chunk(" in inspect.getsource(chunk.ChunkSettings)
    text = inspect.getsource(profile)
    assert "check_base_chunk(" in text
    assert "base_chunk_size < self." not in text and "default_alignment" not in text
    from ppprof.config.chunk import check_base_chunk

    check_base_chunk(64, 64, 1)  # one alignment unit
    with pytest.raises(ValueError, match=r"--base-chunk-size 32 is smaller than --page-size 64"):
        check_base_chunk(32, 64, 1, None, probes=True)
    with pytest.raises(ValueError, match=r"--alignment 96 is larger than --base-chunk-size 64"):
        check_base_chunk(64, 1, 1, 96)
