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
