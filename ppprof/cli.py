"""The `ppprof` command group. Thin: parse options, call one function, turn bad input into one line and exit code 2."""

from __future__ import annotations

import errno
import os
import shlex
import sys

import click

from ppprof import __version__
from ppprof.manifest import COMMAND_ENV

EXIT_BAD_INPUT = 2


class PpprofGroup(click.Group):
    """A click group whose commands report bad input as one line on stderr with exit code 2, never a traceback."""

    def main(self, args=None, *rest, **kwargs):
        # The command line as typed, for the manifest rank 0 writes (ppprof.manifest); a rank keeps its launcher's.
        typed = os.environ.get(COMMAND_ENV)
        if typed is None:
            os.environ[COMMAND_ENV] = shlex.join(["ppprof", *(sys.argv[1:] if args is None else args)])
        try:
            return super().main(args, *rest, **{**kwargs, "standalone_mode": False})
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(1)
        except click.ClickException as e:
            # Usage errors (unknown option, bad type) become one line too.
            click.echo(f"error: {e.format_message()}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except ValueError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except OSError as e:  # an input or output path that cannot be read or written
            where = f" {e.filename}" if e.filename else ""
            click.echo(
                f"error: cannot use{where}: {e.strerror or e}; {OS_ERROR_FIX.get(e.errno, OS_ERROR_FIX[None])}",
                err=True,
            )
            sys.exit(EXIT_BAD_INPUT)
        finally:
            if typed is None:
                os.environ.pop(COMMAND_ENV, None)


OS_ERROR_FIX = {
    errno.ENOSPC: "free space on its file system or write elsewhere",
    errno.EDQUOT: "free space within your quota or write elsewhere",
    errno.EFBIG: "raise the file size limit (ulimit -f) or write elsewhere",
    errno.EROFS: "the file system is read-only: write elsewhere",
    None: "check the path and its permissions",
}
"""The fix an OSError's one line names, by its errno."""


@click.group(
    cls=PpprofGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Example: ppprof profile --out results/my-run",
)
@click.version_option(__version__, prog_name="ppprof")
def main() -> None:
    """Profile prefill chunks on a pipeline-parallel model and write a dynamic-chunk policy for servers."""


from ppprof.commands import COMMANDS  # noqa: E402

for command in COMMANDS:
    main.add_command(command)
