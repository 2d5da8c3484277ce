#!/usr/bin/env bash
# The default model profiled at PP2 x TP1 and at PP2 x TP2 on this machine, the fitted latency coefficients side by
# side, and what TP adds to every chunk (the all-reduces after attention, Mamba and MLP of each layer); OUT/manifest.json
# records the run.
#   bash scripts/experiments/tp_compare.sh [OUT] [extra ppprof profile options]      (default OUT results/tp-compare-<UTC time>)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;; esac
command="bash scripts/experiments/tp_compare.sh${*:+$(printf ' %q' "$@")}"
cd "$(dirname "$0")/../.."
out=${1:-results/tp-compare-$(date -u +%Y%m%d-%H%M%S)}
shift || true
mkdir -p "$out"
for tp in 1 2; do
  .venv/bin/ppprof profile --design grid --pp-size 2 --tp-size "$tp" --out "$out/tp$tp" "$@" > "$out/tp$tp.log" 2>&1 \
    || { echo "tp_compare: the TP$tp profile failed, see $out/tp$tp.log" >&2; exit 1; }
done
# The same latency model on both sides (prefix: c + g L + b x + a (2 L x + x^2)), so that c, b, a and g compare;
# each profile's own policy.json keeps the model its fit chose.
for tp in 1 2; do
  .venv/bin/ppprof fit "$out/tp$tp/samples.csv" --latency-model prefix --min-gain 0 -o "$out/tp$tp/policy-prefix.json" > /dev/null
done
.venv/bin/python - "$out" <<'PY'
import json, platform, sys, time
out = sys.argv[1]
runs = {tp: (json.load(open(f"{out}/tp{tp}/run.json")), json.load(open(f"{out}/tp{tp}/policy-prefix.json"))) for tp in (1, 2)}
names = sorted({k for _, p in runs.values() for k in p["latency_model"]["coefficients"]})
print(f"tp_compare: {runs[1][0]['config']['model']}, PP2, {platform.node()} ({runs[1][0]['hardware'].get('device_name') or ''}, {runs[1][0]['hardware'].get('cpu_count')} cores), "
      f"{time.strftime('%Y-%m-%d', time.gmtime())}")
print("tp  model    " + "  ".join(f"{n:>11}" for n in names) + "  overhead_ms  status")
for tp, (run, policy) in runs.items():
    coef = policy["latency_model"]["coefficients"]
    overhead = (run.get("pipeline_overhead") or {}).get("ms_per_chunk")
    print(f"{tp:<3} {policy['latency_model']['name']:<8} " + "  ".join(
        f"{coef[n]['value']:>11.4g}" if n in coef else f"{'-':>11}" for n in names)
        + f"  {overhead if overhead is not None else '-':>11}  {policy['status']}")
c = [runs[tp][1]["latency_model"]["coefficients"].get("c", {}).get("value") for tp in (1, 2)]
if None not in c:
    print(f"TP adds {c[1] - c[0]:.3f} ms to every chunk's fixed cost c (the all-reduces of a stage's layers)")
PY
# What made OUT, for results/README.md (ppprof.manifest): the command line, git revision, CPU, date.
.venv/bin/python -m ppprof.manifest "$out" --command "$command" > /dev/null
