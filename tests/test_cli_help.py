"""`ppprof --help` and every subcommand's help end with an example line that uses only that command's options."""

import re

from click.testing import CliRunner

from ppprof.cli import main


def last_line(args) -> str:
    result = CliRunner().invoke(main, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output.strip().splitlines()[-1].strip()


def test_group_help_ends_with_an_example():
    assert last_line(["--help"]).startswith("Example: ppprof ")


def test_every_subcommand_help_ends_with_an_example_of_itself():
    assert set(main.commands) >= {"model", "profile", "fit", "plan", "export", "validate", "bench", "compare"}
    for name, command in main.commands.items():
        line = last_line([name, "--help"])
        assert line.startswith(f"Example: ppprof {name} "), (name, line)
        known = {o for p in command.params for o in p.opts}
        used = re.findall(r"(?<![\w-])--?[a-z][a-z0-9-]*", line.split(f"ppprof {name}", 1)[1])
        assert all(o in known for o in used), (name, used)


def flags_listed(args) -> set[str]:
    result = CliRunner().invoke(main, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    return set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", result.output, re.M))


def test_profile_help_lists_the_settings_a_user_chooses_and_help_all_every_option():
    basic = flags_listed(["profile", "--help"])
    assert len(basic) <= 20 and {"--model", "--pp-size", "--out", "--resume", "--help-all"} <= basic
    every = flags_listed(["profile", "--help-all"])
    command = main.commands["profile"]
    shown = {p.opts[0] for p in command.params if not getattr(p, "hidden", False)} | {"--help"}
    assert every == shown, "--help-all lists every option that is not internal"
    assert {"--overhead-repeats", "--packed-forwards", "--warmup", "--nnodes", "--page-size"} <= every - basic


def test_bench_and_serve_bench_keep_torchrun_and_where_the_ranks_run_under_help_all():
    for name in ("bench", "serve-bench"):
        basic, every = flags_listed([name, "--help"]), flags_listed([name, "--help-all"])
        assert "--nnodes" not in basic and "--nnodes" in every and "--torch-threads" in every - basic
        assert "--verbose" in basic


def test_an_advanced_option_still_sets_its_setting():
    ctx = main.commands["profile"].make_context(
        "profile", ["--overhead-repeats", "0", "--nnodes", "1", "--page-size", "4"]
    )
    assert ctx.params["overhead_repeats"] == 0 and ctx.params["nnodes"] == "1" and ctx.params["page_size"] == 4
