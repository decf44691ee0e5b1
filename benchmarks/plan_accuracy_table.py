"""The accuracy table of BENCHMARKS.md "Predicting before training": each GPU cell's measured peak and tokens/s
against the prediction it recorded when it ran and against today's planner (FTPROF_CALIBRATION=off: the probe and
the shipped calibration only), from the run directories of benchmarks/plan_accuracy.sh.

    python benchmarks/plan_accuracy_table.py RUN_DIR... > docs/measurements/DATE-h200-plan-accuracy.csv
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import sys
from pathlib import Path

os.environ["FTPROF_CALIBRATION"] = "off"
GIB = 1 << 30


def cell(run_dir: Path) -> dict | None:
    from ftprof.config import RunConfig
    from ftprof.models.source import resolve_model_source
    from ftprof.plan.candidates import of_config
    from ftprof.plan.predict import Planner, Target

    result = json.loads((run_dir / "result.json").read_text())
    if result["status"] != "ok":
        return None
    cfg = RunConfig.from_dict(json.loads((run_dir / "config.json").read_text()))
    model = dataclasses.replace(cfg.model, checkpointing=result["checkpointing_policy"],
                                checkpoint_layers=result.get("checkpointed_layers"))
    cfg = dataclasses.replace(cfg, model=model)
    now = Planner(cfg, resolve_model_source(cfg.model.model), cfg.model.dtype, Target(result["device_name"]),
                  []).predict(of_config(cfg))
    measured = result["memory_breakdown"].get("training_peak") or result["torch_peak_allocated"]
    then = result["prediction"]
    row = {"cell": of_config(cfg).label, "run_dir": str(run_dir), "measured_gib": measured / GIB,
           "recorded_gib": then["peak_bytes"] / GIB, "today_gib": now.peak_bytes / GIB,
           "measured_tokens_per_s": result["tokens_per_s"], "recorded_tokens_per_s": then.get("tokens_per_s"),
           "today_tokens_per_s": now.tokens_per_s}
    for when in ("recorded", "today"):
        row[f"{when}_memory_error_pct"] = 100 * (row[f"{when}_gib"] - row["measured_gib"]) / row["measured_gib"]
        tps = row[f"{when}_tokens_per_s"]
        row[f"{when}_tokens_per_s_error_pct"] = (None if not tps else 100 * (tps - result["tokens_per_s"])
                                                 / result["tokens_per_s"])
    return row


def main(paths: list[str]) -> int:
    rows = [r for p in paths for d in sorted(Path(p).glob("*/result.json")) if (r := cell(d.parent))]
    writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]))
    writer.writeheader()
    for r in rows:
        writer.writerow({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
