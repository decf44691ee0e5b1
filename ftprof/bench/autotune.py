"""``ftprof plan ... --train``: from a memory budget to a training run in one command. The plan's top K are timed
for a few steps each (one process each, through ``ftprof bench``: failures are results), then the full run trains
with the fastest measured. Its result.json records the plan, the trials and the choice (``selection``), so the
reason a configuration was picked stays with the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftprof.errors import FtprofError

TRIAL_WARMUP = 3  # measurement warm-up steps of a trial (compile and allocator warm-up): the rest are timed


class NoTrialFinished(FtprofError):
    """Every trial failed: nothing measured to choose from."""


@dataclass(frozen=True)
class Trial:
    label: str
    run_dir: str
    status: str
    tokens_per_s: float | None
    predicted_tokens_per_s: float | None
    flat: dict[str, Any]  # the trial's own options (the plan row's candidate)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "run_dir": self.run_dir, "status": self.status,
                "tokens_per_s": self.tokens_per_s, "predicted_tokens_per_s": self.predicted_tokens_per_s,
                "options": self.flat}


def trial_sweep(plan, k: int, base: dict, trial_steps: int) -> str:
    """The sweep YAML of the top ``k``, each for ``trial_steps`` steps (``base``: the plan's own options)."""
    from ftprof.plan.output import sweep_yaml

    trials = {**base, "max_steps": trial_steps, "measure_warmup_steps": min(TRIAL_WARMUP, trial_steps - 1)}
    trials = {key: value for key, value in trials.items() if value is not None}
    for key in ("num_train_epochs", "save", "save_dir", "eval_steps"):  # a trial measures speed, nothing else
        trials.pop(key, None)
    return sweep_yaml(plan, k, trials, name="trials")


def run_trials(plan, k: int, base: dict, trial_steps: int, out_dir: Path) -> list[Trial]:
    """Time the plan's top ``k`` (resumable: a rerun runs only the trials that did not finish)."""
    from ftprof.bench.flow import run_sweep
    from ftprof.bench.sweep import load_sweep
    from ftprof.results.load import run_row
    from ftprof.results.store import write_text_atomic

    path = write_text_atomic(out_dir / "trials-sweep.yaml", trial_sweep(plan, k, base, trial_steps))
    sweep = load_sweep(path)
    run_sweep(sweep, out_dir / "trials")
    trials = []
    for row, experiment in zip(plan.fitting[:k], sweep.experiments, strict=True):
        run_dir = out_dir / "trials" / experiment.name
        try:
            measured = run_row(run_dir)
        except (OSError, ValueError):
            measured = {"status": "not started"}
        speed = measured.get("tokens_per_s") if measured.get("status") == "ok" else None
        trials.append(Trial(row.candidate.label, str(run_dir), str(measured.get("status")), speed,
                            row.prediction.tokens_per_s, row.candidate.flat()))
    return trials


def choose(trials: list[Trial]) -> tuple[Trial, str]:
    """The fastest trial measured, and why."""
    finished = [t for t in trials if t.tokens_per_s]
    if not finished:
        raise NoTrialFinished("no trial finished: " + "; ".join(f"{t.label}: {t.status}" for t in trials))
    best = max(finished, key=lambda t: t.tokens_per_s)
    predicted_first = trials[0]
    why = f"fastest measured of {len(finished)} trial(s) ({best.tokens_per_s:,.0f} tokens/s"
    if best is not predicted_first:
        measured = f"{predicted_first.tokens_per_s:,.0f} measured" if predicted_first.tokens_per_s else \
            predicted_first.status
        why += f"; the plan's #1, {predicted_first.label}, {measured}"
    return best, why + ")"


def train_chosen(chosen: Trial, trials: list[Trial], why: str, base: dict, plan_json: Path, output_dir: str):
    """Train the full run with the chosen configuration into ``output_dir``, then record the selection in its
    result.json."""
    import ftprof
    from ftprof.config import RunConfig
    from ftprof.results.run_dir import RESULT
    from ftprof.results.store import write_json_atomic

    values = {key: value for key, value in {**base, **chosen.flat}.items() if value is not None}
    values["output_dir"] = output_dir
    result = ftprof.train(RunConfig.from_flat(values))
    selection = {"plan": str(plan_json), "trials": [t.to_dict() for t in trials], "choice": chosen.label,
                 "reason": why}
    path = Path(result.run_dir) / RESULT
    if path.is_file():  # the run wrote its result: the selection joins it (one atomic rewrite)
        import json

        data = json.loads(path.read_text())
        data["selection"] = selection
        write_json_atomic(path, data)
    return result, selection
