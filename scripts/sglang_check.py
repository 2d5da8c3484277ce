"""SGLang with a ppprof policy, on GPUs (the SGLang step of scripts/gpu_check.sh, run where sglang is installed).

Profiles Llama-3-8B shapes with a few layers (random weights; SGLang runs the same config with --load-format dummy),
then starts SGLang with PP and each arm in turn: `policy` (python -m ppprof.sglang: the policy's rules, no start-up
profile), `sglang-dynamic` (SGLang's own boot-profiled dynamic chunking), `fixed` (chunks of B) and `fixed-best` (the
policy's best fixed chunk); sends long prompts (16K, 32K tokens) to each and records the time to first token
(max_new_tokens 1: the request's latency is its prefill's) and the boot time (launch to a healthy server).

    .venv/bin/python scripts/sglang_check.py --out results/gpu-check-X/sglang --pp 2
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ppprof.manifest import script_parser, write_result
from ppprof.policy.policy_file import load
from ppprof.policy.runtime import largest_chunk

PAGE_SIZE = 64
CONTEXT_LEN = 40960
SGLANG_PREFILL_CAP = 16384  # SGLang's default --max-prefill-tokens
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}


def model_dir(out: Path, num_layers: int) -> Path:
    """A model folder SGLang and ppprof both read: Llama-3-8B's config.json with `num_layers` layers."""
    path = out / f"llama3-8b-{num_layers}layers"
    path.mkdir(parents=True, exist_ok=True)
    config = {**LLAMA3_8B, "num_hidden_layers": num_layers, "max_position_embeddings": CONTEXT_LEN}
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def profile(out: Path, model: Path, pp: int, base: int, prompt_lens: list[int]) -> Path:
    """ppprof profile of the model on `pp` GPUs (prefix probes up to 32K); the policy's path."""
    run = out / "profile"
    cmd = [
        str(Path(sys.executable).with_name("ppprof")),
        "profile",
        "--design",
        "grid",
        "--device",
        "cuda",
        "--nproc-per-node",
        str(pp),
        "--model",
        str(model / "config.json"),
        "--dtype",
        "bf16",
        "--base-chunk-size",
        str(base),
        "--page-size",
        str(PAGE_SIZE),
        "--context-len",
        str(CONTEXT_LEN),
        "--requests-per-probe",
        "32",
        "--prefix-lens",
        "4096,16384,32768",
        "--prompt-lens",
        ",".join(map(str, prompt_lens)),
        "--out",
        str(run),
        "--overwrite",
    ]
    with open(out / "profile.log", "w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=1800)
    return run / "policy.json"


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def launch(cmd: list[str], env: dict, log: Path, port: int, deadline_s: float = 1200) -> tuple[subprocess.Popen, float]:
    """Start the server in its own process group; (the process, seconds from launch to healthy)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    while not healthy(port):
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before it was healthy: see {log}")
        if time.perf_counter() - start > deadline_s:
            stop(proc)
            raise RuntimeError(f"the server was not healthy within {deadline_s:.0f} s: see {log}")
        time.sleep(1)
    return proc, time.perf_counter() - start


def stop(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def ttft_ms(port: int, prompt_len: int, rng: random.Random) -> float:
    """One request of `prompt_len` random token ids and one new token: its latency, in ms."""
    body = {
        "input_ids": [rng.randrange(1000, 100000) for _ in range(prompt_len)],
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as r:
        r.read()
    return (time.perf_counter() - start) * 1e3


def run_arm(name: str, cmd: list[str], env: dict, out: Path, args) -> dict:
    log = out / f"{name}.log"
    proc, boot_s = launch(cmd, env, log, args.port)
    try:
        rng = random.Random(0)
        ttft_ms(args.port, 1024, rng)  # warm-up
        ttft = {n: [round(ttft_ms(args.port, n, rng), 1) for _ in range(args.repeats)] for n in args.prompt_lens}
    finally:
        stop(proc)
    lines = [
        x.strip()
        for x in log.read_text(errors="replace").splitlines()
        if "[PP Dynamic Chunk]" in x or x.startswith("ppprof:") or "ChunkSizePredictor" in x
    ]
    return {
        "command": cmd,
        "boot_s": round(boot_s, 1),
        "ttft_ms": ttft,
        "median_ttft_ms": {n: statistics.median(v) for n, v in ttft.items()},
        "log": lines[:20],
    }


def arms(args, model: Path, policy_path: Path) -> dict[str, list[str]]:
    policy = load(policy_path)
    base, best = policy.settings.base_chunk_size, (policy.report.predicted or {}).get("fixed_best_chunk")
    common = [
        "--model-path",
        str(model),
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--pp-size",
        str(args.pp),
        "--tp-size",
        "1",
        "--page-size",
        str(PAGE_SIZE),
        "--context-length",
        str(CONTEXT_LEN),
        "--port",
        str(args.port),
        "--max-prefill-tokens",
        str(max(SGLANG_PREFILL_CAP, largest_chunk(policy))),
    ]
    server = [sys.executable, "-m", "sglang.launch_server"]
    out = {
        "policy": [
            sys.executable,
            "-m",
            "ppprof.sglang",
            "--policy",
            str(policy_path),
            "--",
            *common,
            "--enable-dynamic-chunking",
            "--chunked-prefill-size",
            str(base),
        ],
        "sglang-dynamic": [*server, *common, "--enable-dynamic-chunking", "--chunked-prefill-size", str(base)],
        "fixed": [*server, *common, "--chunked-prefill-size", str(base)],
    }
    if best and best != base:
        out["fixed-best"] = [*server, *common, "--chunked-prefill-size", str(best)]
    return out


def summary(results: dict, prompt_lens: list[int]) -> list[str]:
    lines = ["  arm              boot s  " + "  ".join(f"TTFT {n // 1024}K ms" for n in prompt_lens)]
    for name, r in results.items():
        lines.append(
            f"  {name:<16} {r['boot_s']:>6}  " + "  ".join(f"{r['median_ttft_ms'][n]:>11.1f}" for n in prompt_lens)
        )
    if "policy" in results and "sglang-dynamic" in results:
        p, s = results["policy"], results["sglang-dynamic"]
        lines.append(
            f"  boot time saved by the policy: {s['boot_s'] - p['boot_s']:.1f} s; policy / SGLang's dynamic "
            "TTFT: " + ", ".join(f"{n}: {p['median_ttft_ms'][n] / s['median_ttft_ms'][n]:.3f}" for n in prompt_lens)
        )
    return lines


def main() -> int:
    p = script_parser(__doc__, None)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--base-chunk-size", type=int, default=4096)
    p.add_argument("--prompt-lens", type=lambda s: [int(x) for x in s.split(",")], default=[16384, 32768])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--port", type=int, default=30123)
    args = p.parse_args()
    if args.out is None:
        p.error("give -o/--out, the folder of its results")
    args.out = Path(args.out)
    if args.pp < 2:
        print("sglang_check: SGLang's dynamic chunking needs PP >= 2 (two GPUs); skipped")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    model = model_dir(args.out, 2 * args.pp)
    policy_path = profile(args.out, model, args.pp, args.base_chunk_size, args.prompt_lens)
    print(f"  policy {policy_path}")
    env = {k: v for k, v in os.environ.items() if k != "PPPROF_POLICY"}
    results = {name: run_arm(name, cmd, env, args.out, args) for name, cmd in arms(args, model, policy_path).items()}
    write_result(args.out / "results.json", results)
    print("\n".join(summary(results, args.prompt_lens)))
    matched = any("matches this server" in x for x in results["policy"]["log"])
    print("  policy arm: " + ("the policy was loaded" if matched else "the policy was NOT loaded") + "; log:")
    print("\n".join(f"    {x}" for x in results["policy"]["log"][:6]))
    return 0 if matched else 1


if __name__ == "__main__":
    sys.exit(main())
