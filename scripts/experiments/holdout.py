"""How well a policy's latency model predicts a profile it never saw: another seed, other prefix lengths.

The holdout profile's rows (warm-up rows dropped, as the fit drops them) are predicted by the policy's model. A run on
a shared machine is a few percent faster or slower as a whole than the run the policy was fitted to; that level shift
is the median of measured / predicted over the holdout's prefix-free (sweep) rows, which are not judged. The figure
judged is the MAPE on the prefixed rows after that shift (and without it), overall and per prefix length. Its floor is
what the holdout's own fit (the same latency model, fitted to the holdout's rows) scores on them: the rows' own noise,
which no model fitted elsewhere can beat.

Usage: python scripts/experiments/holdout.py POLICY HOLDOUT_RUN [-o results/holdout/holdout.json]
  e.g. ppprof profile --design grid --seed 1 --prefix-lens 3000 --prefix-lens 9000 --prefix-lens 20000 --out /tmp/holdout
       python scripts/experiments/holdout.py results/baseline/policy.json /tmp/holdout
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from ppprof.fit.build import fit
from ppprof.fit.samples import read_samples
from ppprof.fit.selection import without_warmup
from ppprof.manifest import script_parser, write_result
from ppprof.policy import LatencyModel, load
from ppprof.runfiles import SAMPLES_FILE

TARGET_MAPE = 0.05


def mape(measured: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured))


def holdout(policy_path: Path, run: Path) -> dict:
    policy = load(policy_path)
    if policy.latency_model is None:
        raise ValueError(f"{policy_path} has no latency model: fit a profile first")
    samples, _ = without_warmup(read_samples(run / SAMPLES_FILE))
    L, x, y = samples.prefix_len, samples.chunk_size, samples.chunk_latency_ms
    predicted = policy.latency_model.chunk_latency_ms(L.astype(float), x.astype(float))
    sweep, prefixed = L == 0, L > 0
    if not sweep.any() or not prefixed.any():
        raise ValueError(f"{run / SAMPLES_FILE} needs prefix-free and prefixed rows")
    shift = float(np.median(y[sweep] / predicted[sweep]))
    shift_all = float(np.median(y / predicted))  # the whole run's level, prefixed rows included
    with tempfile.TemporaryDirectory() as tmp:  # the floor: the holdout's own fit of the same latency model
        _, own = fit(run / SAMPLES_FILE, Path(tmp) / "policy.json", latency_model=policy.latency_model.name)
    own_model = LatencyModel.from_dict(own["latency_model"])
    floor = mape(y[prefixed], own_model.chunk_latency_ms(L[prefixed].astype(float), x[prefixed].astype(float)))
    by_prefix = [
        {
            "prefix_len": int(p),
            "rows": int((L == p).sum()),
            "mape_shifted": mape(y[L == p], shift * predicted[L == p]),
            "median_ratio": float(np.median(y[L == p] / (shift * predicted[L == p]))),
        }
        for p in np.unique(L[prefixed])
    ]
    run_json = json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {}
    return {
        "what": "the policy's latency model on a profile it never saw: MAPE of the prefixed rows after the level "
        "shift measured on the prefix-free rows",
        "policy": str(policy_path),
        "latency_model": policy.latency_model.name,
        "fitted_prefix_lens": (policy.report.domain or {}).get("prefix_lens"),
        "holdout": str(run),
        "holdout_seed": (run_json.get("config") or {}).get("seed"),
        "holdout_prefix_lens": [r["prefix_len"] for r in by_prefix],
        "rows": {"sweep": int(sweep.sum()), "prefixed": int(prefixed.sum())},
        "level_shift": shift,
        "mape_prefixed_shifted": mape(y[prefixed], shift * predicted[prefixed]),
        "mape_prefixed_unshifted": mape(y[prefixed], predicted[prefixed]),
        "level_shift_all_rows": shift_all,
        "mape_prefixed_shifted_all_rows": mape(y[prefixed], shift_all * predicted[prefixed]),
        "mape_sweep_shifted": mape(y[sweep], shift * predicted[sweep]),
        "mape_prefixed_own_fit": floor,
        "target_mape": TARGET_MAPE,
        "by_prefix": by_prefix,
    }


def main() -> int:
    parser = script_parser(__doc__, None)
    parser.add_argument("policy", type=Path)
    parser.add_argument("run", type=Path)
    args = parser.parse_args()
    try:
        report = holdout(args.policy, args.run)
    except (OSError, ValueError) as e:
        print(f"bench_holdout: {e}", file=sys.stderr)
        return 2
    print(
        f"level shift {report['level_shift']:.3f} (prefix-free rows); prefixed rows MAPE "
        f"{report['mape_prefixed_shifted']:.1%} after it ({report['mape_prefixed_unshifted']:.1%} before), "
        f"{report['mape_prefixed_shifted_all_rows']:.1%} after the whole run's level "
        f"({report['level_shift_all_rows']:.3f}), target {TARGET_MAPE:.0%}; the holdout's own {report['latency_model']} fit scores "
        f"{report['mape_prefixed_own_fit']:.1%} on them (the rows' noise)"
    )
    for r in report["by_prefix"]:
        print(
            f"  prefix_len {r['prefix_len']:>6}: {r['rows']:>3} rows, MAPE {r['mape_shifted']:.1%}, "
            f"median measured / predicted {r['median_ratio']:.3f}"
        )
    if args.out:
        write_result(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
