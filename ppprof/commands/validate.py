"""`ppprof validate`: check a policy against its schema and rule, or print the schema."""

from __future__ import annotations

import json

import click

from ppprof.policy.policy_file import load
from ppprof.policy.schema import schema_text
from ppprof.policy.summary import next_commands, summary_block, summary_line, typical_prompt_len, verbose_lines


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
    help="Also print the whole record in one line, the model's checks, the per-row gates (diagnostics) and the "
    "gain's interval.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: the short block's facts and the record.")
def validate_command(policy_path, show_schema, verbose, as_json) -> None:
    """Check POLICY against the policy schema and the rule; print 'ok POLICY' and a short block (the decision, a
    typical prompt's predicted TTFT against fixed B, the model, the rule under load; exit 0) or one line naming the
    field (exit 2). With --schema, print the JSON Schema instead."""
    if show_schema:
        if policy_path is not None:
            raise click.UsageError("--schema prints the schema and takes no POLICY: give one or the other")
        click.echo(schema_text(), nl=False)  # generated from the contract (ppprof.policy.contract_schema)
        return
    if policy_path is None:
        raise click.UsageError("Missing argument 'POLICY': give a policy.json, or --schema to print the schema")
    policy = load(policy_path)
    block = summary_block(policy, policy_path)
    if as_json:
        record = {
            "ok": True,
            "policy": policy_path,
            "status": policy.status,
            "reason": policy.reason,
            "summary": summary_line(policy),
            "lines": [line.strip() for line in block[1:]],
            "next": next_commands(policy_path, typical_prompt_len(policy)),
        }
        click.echo(json.dumps(record, indent=2))
        return
    click.echo("\n".join(block))
    if verbose:
        click.echo(f"  in full: {summary_line(policy)}")
        click.echo("\n".join(verbose_lines(policy)))
