"""`ppprof validate`: check a policy against its schema and rule, or print the schema."""

from __future__ import annotations

import click

from ppprof.policy.policy_file import load
from ppprof.policy.schema import SCHEMA_FILE
from ppprof.policy.summary import summary_line, verbose_lines


@click.command("validate", epilog="Example: ppprof validate results/my-run/policy.json")
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False), required=False)
@click.option(
    "--schema",
    "show_schema",
    is_flag=True,
    help="Print the policy's JSON Schema (draft 2020-12), the contract servers validate against.",
)
@click.option(
    "--verbose",
    is_flag=True,
    help="Also print the model's checks, the per-row gates (diagnostics) and the gain's interval.",
)
def validate_command(policy_path, show_schema, verbose) -> None:
    """Check POLICY against the policy schema and the rule; print 'ok ...' (exit 0) or one line naming the field
    (exit 2). With --schema, print the JSON Schema instead."""
    if show_schema:
        if policy_path is not None:
            raise click.UsageError("--schema prints the schema and takes no POLICY: give one or the other")
        click.echo(SCHEMA_FILE.read_text(), nl=False)
        return
    if policy_path is None:
        raise click.UsageError("Missing argument 'POLICY': give a policy.json, or --schema to print the schema")
    policy = load(policy_path)
    click.echo(f"ok {policy_path}: {summary_line(policy)}")
    if verbose:
        click.echo("\n".join(verbose_lines(policy)))
