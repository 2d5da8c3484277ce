"""Summary of scripts/experiments/confidence_host.sh's profiles: each run's status by the decision's confidence (its
policy.json) beside the status the per-row gates gave before this rule (dynamic where every gate of
diagnostics.row_gates and diagnostics.gates passed and the predicted gain reached the default least gain, 2%), its predicted gain
with the gain's interval, and its wall time; then, for quiet and loaded runs, how many give the quiet runs' decision
(the most common one among them), the spread of the gains, and the median wall time.

Usage: python scripts/experiments/confidence_host.py OUT_FOLDER [-o OUT.json]
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from ppprof.config.policy import DEFAULT_MIN_GAIN
from ppprof.manifest import script_parser, write_result
from ppprof.policy.runtime import report_of


def run_row(folder: Path) -> dict:
    """One profile's figures."""
    policy = json.loads((folder / "policy.json").read_text())
    report = report_of(policy)  # any schema version's
    diag, predicted = report.get("diagnostics") or {}, report.get("predicted") or {}
    gates = [*(diag.get("row_gates") or []), *(diag.get("gates") or [])]
    old_gates = [g for g in gates if g.get("name") != "form_error"]  # the form check is this rule's
    gain = predicted.get("gain_vs_fixed_best")
    passed = bool(old_gates) and all(g["passed"] for g in old_gates)
    before = "dynamic" if passed and gain is not None and gain >= DEFAULT_MIN_GAIN else "static"
    wall = folder.with_name(folder.name + ".wall_s")
    return {
        "run": folder.name,
        "status": policy["status"],
        "status_before": before,
        "reason": policy.get("reason"),
        "gain": gain,
        "gain_interval": predicted.get("gain_interval"),
        "failed_row_gates": [g["name"] for g in old_gates if not g["passed"]],
        "wall_s": float(wall.read_text()) if wall.is_file() else None,
    }


def group(rows: list[dict], decision: str | None) -> dict:
    """How many runs give `decision`, before and after, the gains' spread and the median wall time."""
    gains = [r["gain"] for r in rows if r["gain"] is not None]
    lower = [r["gain_interval"]["lower"] for r in rows if r.get("gain_interval")]
    return {
        "runs": len(rows),
        "agree_after": sum(r["status"] == decision for r in rows),
        "agree_before": sum(r["status_before"] == decision for r in rows),
        "gain": [min(gains), float(np.median(gains)), max(gains)] if gains else None,
        "gain_lower_bound": [min(lower), float(np.median(lower)), max(lower)] if lower else None,
        "wall_s_median": float(np.median(walls)) if (walls := [r["wall_s"] for r in rows if r["wall_s"]]) else None,
    }


def main() -> None:
    parser = script_parser(__doc__, None)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    rows = [run_row(p.parent) for p in sorted(args.folder.glob("*/policy.json"))]
    quiet = [r for r in rows if r["run"].startswith("quiet")]
    decision = Counter(r["status"] for r in quiet).most_common(1)[0][0] if quiet else None
    result = {
        "what": __doc__.splitlines()[0],
        "background_load": "loaded runs: one Python busy loop (`while True: pass`) beside the profile, 1 of 2 cores",
        "quiet_decision": decision,
        "quiet": group(quiet, decision) if quiet else None,
        "loaded": group(loaded, decision) if (loaded := [r for r in rows if r["run"].startswith("loaded")]) else None,
        "runs": rows,
    }
    for r in rows:
        lower = (r["gain_interval"] or {}).get("lower")
        print(
            f"{r['run']}: {r['status']} (before: {r['status_before']}), gain {r['gain']}, lower bound {lower}, "
            f"{r['wall_s']} s; row gates failed: {r['failed_row_gates']}"
        )
    print(json.dumps({k: result[k] for k in ("quiet_decision", "quiet", "loaded")}, indent=1))
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()
