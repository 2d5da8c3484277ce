"""`ppprof export`: the server flags that carry a policy, and where that server's own rule sizes chunks differently
(ppprof.servers.export)."""

from __future__ import annotations

import json

import click

from ppprof.policy.policy_file import load
from ppprof.servers import SERVERS
from ppprof.servers.export import export, export_data


@click.command("export", epilog="Example: ppprof export results/my-run/policy.json --server sglang")
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False))
@click.option(
    "--server", type=click.Choice(SERVERS), default=None, help="The server whose flags carry the policy (required)."
)
@click.option("--format", "fmt", type=click.Choice(SERVERS), hidden=True, help="Deprecated: the old name of --server.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON: flags, comments and where the server's rule differs."
)
def export_command(policy_path, server, fmt, as_json) -> None:
    """Print the server settings that carry POLICY (SGLang, vllm-ascend or ATOM), and where that server's own rule
    would size chunks differently with them."""
    if server is not None and fmt is not None and server != fmt:
        raise click.UsageError(f"--server {server} and --format {fmt} name different servers: give --server alone")
    server = server or fmt
    if server is None:
        raise click.UsageError(f"Missing option '--server': give one of {', '.join(SERVERS)}")
    policy = load(policy_path)
    if as_json:
        click.echo(json.dumps(export_data(policy, server, policy_path), indent=2))
    else:
        click.echo(export(policy, server, policy_path))
