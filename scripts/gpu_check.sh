#!/usr/bin/env bash
# The GPU checks, in one run, for a machine with NVIDIA GPUs: environment report, the CUDA numerics tests, the TP
# numerics and the bounded MLA prefix, and short profiles with real layer shapes over NCCL (llama3-8b and
# nemotron-h-8b, few layers per stage), each with its peak memory against ppprof's estimate and the attention / Mamba
# kernels that ran. Everything lands in one folder.
#   bash scripts/gpu_check.sh [OUT]        (default results/gpu-check-<UTC time>; about 5-10 minutes on one H200)
# GPU_CHECK_STEP_TIMEOUT=S bounds each step (default 420 s; a short device lease wants about 150).
# GPU_CHECK_EXTRAS=1 also tries `pip install flashinfer-python mamba-ssm causal-conv1d flash-linear-attention` (the `gpu` extra) first.
set -uo pipefail
command="bash scripts/gpu_check.sh${*:+$(printf ' %q' "$@")}"
cd "$(dirname "$0")/.."
out=${1:-results/gpu-check-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"
status=0
limit=${GPU_CHECK_STEP_TIMEOUT:-420}
step() { echo "== $*" | tee -a "$out/summary.txt"; }

step "set-up"
bash scripts/setup.sh > "$out/setup.log" 2>&1 || { echo "setup failed, see $out/setup.log"; exit 1; }
if [ "${GPU_CHECK_EXTRAS:-0}" = 1 ]; then
  .venv/bin/python -m pip install -q flashinfer-python mamba-ssm causal-conv1d flash-linear-attention >> "$out/setup.log" 2>&1 \
    || echo "optional GPU kernels did not install (see setup.log); the checks run without them" | tee -a "$out/summary.txt"
fi
PY=.venv/bin/python

step "environment"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
$PY - > "$out/env.json" <<'EOF'
import importlib.util, json, torch
gpus = [{"name": torch.cuda.get_device_name(i), "total_memory": torch.cuda.get_device_properties(i).total_memory}
        for i in range(torch.cuda.device_count())]
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                  "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
                  "gpus": gpus, "flashinfer": importlib.util.find_spec("flashinfer") is not None,
                  "mamba_ssm": importlib.util.find_spec("mamba_ssm") is not None,
                  "causal_conv1d": importlib.util.find_spec("causal_conv1d") is not None,
                  "fla": importlib.util.find_spec("fla") is not None}, indent=2))
EOF
cat "$out/env.json" | tee -a "$out/summary.txt"
ngpu=$($PY -c "import torch; print(torch.cuda.device_count())")

# The full-size dry run (meta tensors, no rank, seconds on the CPU): DeepSeek-V3 at SGLang's PP4 x TP8, every rank
# built and run once at the largest probe request, against this machine's GPU (80 GiB where none is visible).
step "dry run: DeepSeek-V3 at PP4 x TP8"
device_memory=$( [ "$ngpu" -ge 1 ] && echo cuda || echo 80GiB )
timeout "$limit" .venv/bin/ppprof profile --dry-run --model tests/specs/data/deepseek_v3/config.json --pp-size 4 \
  --tp-size 8 --dtype bf16 --device-memory "$device_memory" > "$out/dry-run-deepseek-v3.txt" 2>&1 || status=1
tail -n 3 "$out/dry-run-deepseek-v3.txt" | tee -a "$out/summary.txt"

[ "$ngpu" -ge 1 ] || { echo "no CUDA device visible" | tee -a "$out/summary.txt"; exit 1; }
pp=$(( ngpu >= 4 ? 4 : (ngpu >= 2 ? 2 : 1) ))

step "numerics on CUDA (tests/model/test_cuda.py) and the whole model suite"
timeout "$limit" $PY -m pytest -q -p no:cacheprovider tests/model -rs > "$out/numerics.log" 2>&1 || status=1
tail -n 3 "$out/numerics.log" | tee -a "$out/summary.txt"

# TP numerics on gloo (a TP = 2 stage equals TP = 1 for every layer kind, MLA's and Gated DeltaNet's other forms too),
# the bounded MLA prefix (spans equal the whole prefix, on CPU and through CUDA's memory-efficient kernel) and its
# memory term.
step "TP numerics and the bounded MLA prefix"
timeout "$limit" $PY -m pytest -q -p no:cacheprovider tests/distributed/test_tp_numerics.py tests/specs/test_tp.py \
  tests/model/test_mla.py tests/specs/test_memory.py -k "tp or span" -rs > "$out/tp-numerics.log" 2>&1 || status=1
tail -n 3 "$out/tp-numerics.log" | tee -a "$out/summary.txt"

profile() {  # name, then ppprof profile options
  local name=$1; shift
  step "profile $name: $*"
  timeout "$limit" .venv/bin/ppprof profile --design grid --device cuda --nproc-per-node "$pp" --out "$out/$name" "$@" \
    > "$out/$name.log" 2>&1 || { status=1; tail -n 5 "$out/$name.log" | tee -a "$out/summary.txt"; return; }
  $PY - "$out/$name" <<'EOF' | tee -a "$out/summary.txt"
import json, sys
run = json.load(open(f"{sys.argv[1]}/run.json"))
print(f"  attention {run['attention_backend']} -> {run['attention_kernel']}; mamba {run['mamba_kernel']}")
print(f"  probing {run['probe_wall_s']:.1f} s, {run['forward_tokens']} forward tokens a stage")
est = run.get("estimated_memory_bytes_per_stage") or [None] * len(run["peak_memory_bytes_per_stage"])
for s, (peak, e) in enumerate(zip(run["peak_memory_bytes_per_stage"], est)):
    ratio = f", estimate / peak {e / peak:.2f}" if e and peak else ""
    print(f"  stage {s}: peak {peak / 2**30:.2f} GiB" + (f", estimate {e / 2**30:.2f} GiB" if e else "") + ratio)
EOF
  case " $* " in *" --no-fit "*) ;; *) .venv/bin/ppprof validate "$out/$name/policy.json" 2>&1 | tee -a "$out/summary.txt" ;; esac
}

profile llama3-8b --model llama3-8b --num-layers $((2 * pp)) --dtype bf16 --base-chunk-size 2048 --page-size 64 \
  --requests-per-probe 32 --prefix-lens 2048,8192,24576
profile llama3-8b-reference --model llama3-8b --num-layers $((2 * pp)) --dtype bf16 --base-chunk-size 2048 \
  --page-size 64 --requests-per-probe 32 --prefix-lens 2048,8192 --attention-backend reference --no-fit
profile nemotron-h-8b --config configs/profile-nemotron-h-8b-gpu.yaml --num-layers $((8 * pp)) \
  --requests-per-probe 32 --prefix-lens 8192,32768
# MLA + MoE at real size (Kimi-K2's config.json: a dense layer, then a layer of 384 experts, about 37 GiB a GPU in
# bf16 at two layers a stage), TP 1: the latent KV pool and the decompressed prefix at real shapes.
profile kimi-k2 --model tests/specs/data/kimi_k2/config.json --num-layers $((2 * pp)) --dtype bf16 \
  --base-chunk-size 2048 --page-size 64 --requests-per-probe 8 --prefix-lens 2048,8192

# PP2 x TP2 over NCCL (a 2-D mesh, TP ranks of a stage on adjacent GPUs): four GPUs, one a rank.
if [ "$ngpu" -ge 4 ]; then
  tp_out="$out/llama3-8b-pp2-tp2"
  step "profile llama3-8b PP2 x TP2 (NCCL)"
  timeout "$limit" .venv/bin/ppprof profile --design grid --device cuda --pp-size 2 --tp-size 2 --nproc-per-node 4 --out "$tp_out" \
    --model llama3-8b --num-layers 4 --dtype bf16 --base-chunk-size 2048 --page-size 64 --requests-per-probe 32 \
    --prefix-lens 2048,8192,24576 > "$tp_out.log" 2>&1 || { status=1; tail -n 5 "$tp_out.log" | tee -a "$out/summary.txt"; }
  if [ -f "$tp_out/run.json" ]; then
    $PY - "$tp_out" <<'EOF' | tee -a "$out/summary.txt"
import json, sys
run = json.load(open(f"{sys.argv[1]}/run.json"))
print(f"  status {run['status']}; world {run['world_size']} = pp {run['pp_size']} x tp {run['tp_size']}")
for s, (ms, peak) in enumerate(zip(run["median_forward_ms_per_tp_rank"], run["peak_memory_bytes_per_tp_rank"])):
    print(f"  stage {s}: median forward per TP rank {ms} ms, peak {[round(p / 2**30, 2) if p else None for p in peak]} GiB")
EOF
    .venv/bin/ppprof validate "$tp_out/policy.json" 2>&1 | tee -a "$out/summary.txt"
  fi
else
  step "profile PP2 x TP2 skipped: it needs 4 GPUs, $ngpu visible"
fi

step "model --memory for the shipped GPU config"
.venv/bin/ppprof model nemotron-h-8b --memory --config configs/profile-nemotron-h-8b-gpu.yaml \
  > "$out/memory-nemotron-h-8b.txt" 2>&1 || status=1
cat "$out/memory-nemotron-h-8b.txt" >> "$out/summary.txt"
# SGLang loading the policy (docs/sglang.md), where sglang is installed and PP2 fits: TTFT of 16K and 32K prompts and
# the boot time against SGLang's own boot-profiled dynamic chunking and fixed chunks.
if $PY -c 'import sglang' > /dev/null 2>&1 && [ "$pp" -ge 2 ]; then
  step "SGLang with the policy, PP$pp (scripts/sglang_check.py)"
  timeout 3600 $PY scripts/sglang_check.py --out "$out/sglang" --pp "$pp" 2>&1 | tee -a "$out/summary.txt" || status=1
else
  step "SGLang with the policy skipped: it needs sglang in .venv and 2 GPUs ($ngpu visible)"
fi

$PY -m ppprof.manifest "$out" --command "$command" > /dev/null || status=1  # what made OUT (ppprof.manifest)
echo "gpu_check: $( [ $status = 0 ] && echo passed || echo FAILED ), results in $out" | tee -a "$out/summary.txt"
exit $status
