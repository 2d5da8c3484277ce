"""`python -m ppprof.sglang --policy POLICY -- SERVER_ARGS`: SGLang's server with ppprof's policy sizer. Checks the
policy as `ppprof validate` does and the arguments that must carry it, then runs `python -m sglang.launch_server
SERVER_ARGS` with PPPROF_POLICY set to the policy and ppprof's start-up hook first on PYTHONPATH, so that every
process of the server (SGLang's spawned schedulers too) starts with it."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ppprof.bounds import POLICY_ENV
from ppprof.policy.policy_file import load
from ppprof.policy.runtime import Policy, largest_chunk

ON_PYTHONPATH = Path(__file__).resolve().with_name("on-pythonpath")
"""The folder put first on PYTHONPATH: its sitecustomize.py installs the hook in every process that starts."""
SERVER_MODULE = "sglang.launch_server"
EXAMPLE = (
    "Example: python -m ppprof.sglang --policy results/my-run/policy.json -- --model-path "
    "meta-llama/Meta-Llama-3-8B --pp-size 2 --enable-dynamic-chunking --chunked-prefill-size 8192"
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ppprof.sglang",
        epilog=EXAMPLE,
        usage="python -m ppprof.sglang --policy POLICY [--server-module M] -- SERVER_ARGS",
        description="Run SGLang's server with ppprof's policy sizing its prefill chunks (docs/sglang.md).",
    )
    p.add_argument("--policy", required=True, metavar="POLICY", help="The policy.json the server loads.")
    p.add_argument(
        "--server-module",
        default=SERVER_MODULE,
        metavar="M",
        help=f"The module that starts the server (default {SERVER_MODULE}).",
    )
    return p


def server_flag(args: list[str], flag: str) -> str | None:
    """The value of `flag` in SGLang's arguments (`--flag V` or `--flag=V`), the last one given; None if absent."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def check_server_args(policy: Policy, args: list[str]) -> None:
    """ValueError (one line, the fix) where SGLang's arguments cannot carry the policy: dynamic chunking off, or
    a chunked prefill size or chunk cap the sizer would refuse at load."""
    if "--enable-dynamic-chunking" not in args:
        raise ValueError(
            "--enable-dynamic-chunking is not among the server's arguments: SGLang builds no chunk "
            "sizer without it; add it after --"
        )
    base = policy.settings.base_chunk_size
    given = server_flag(args, "--chunked-prefill-size")
    if given != str(base):
        raise ValueError(
            f"--chunked-prefill-size {given or '(not given)'}: the policy's base_chunk_size is {base}; "
            f"pass --chunked-prefill-size {base} after --"
        )
    largest, cap = largest_chunk(policy), server_flag(args, "--max-prefill-tokens")
    if cap is not None and (not cap.isdigit() or int(cap) < largest):
        raise ValueError(
            f"--max-prefill-tokens {cap}: below the policy's largest chunk {largest}; pass "
            f"--max-prefill-tokens {largest} or more after --"
        )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    options, server_args = parser().parse_args(argv[:split]), argv[split + 1 :]
    try:
        if split == len(argv):
            raise ValueError(
                "no server arguments: give SGLang's after --, python -m ppprof.sglang --policy POLICY "
                "-- --model-path MODEL ..."
            )
        policy = load(options.policy)
        check_server_args(policy, server_args)
    except ValueError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(2)
    env = dict(os.environ)
    env[POLICY_ENV] = str(Path(options.policy).resolve())
    env["PYTHONPATH"] = os.pathsep.join([str(ON_PYTHONPATH), *filter(None, [env.get("PYTHONPATH")])])
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", options.server_module, *server_args], env)


if __name__ == "__main__":
    main()
