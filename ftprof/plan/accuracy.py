"""How accurate the predictor was: each run's prediction (result.json's ``prediction``) against what the run
measured, for the report's "Prediction error" section and ``ftprof plan --verify``. No torch import.

Input shape: the report's flat row, one per run (``ftprof.results.load.run_row``: config options plus result.json
flattened with ``_``, so the prediction's fields read ``prediction_peak_bytes``, ``prediction_tokens_per_s``, ...,
and the memory breakdown's ``memory_breakdown_training_peak``, ...). A dict or a pandas Series; the frame functions
take a DataFrame of such rows or a list of them. ``row_from_run_dir`` and ``row_from_records`` build the same row
from a run directory or from result.json and config.json as dicts.

What is compared (``measured`` and ``predicted`` are the one place that decides it):

- memory, on a GPU: the training peak of torch's allocator, which is what ``prediction.peak_bytes`` predicts;
- memory, on the CPU: the parts (static + activations), because the CPU has no allocator peak to compare with;
- tokens/s: the run's global tokens/s against ``prediction.tokens_per_s`` (None: no speed prediction, not compared).

Signed relative error = (predicted - measured) / measured. Memory under-predicted by more than 5% is flagged: it is
the dangerous direction (a plan that says it fits, and a run that runs out of memory).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftprof.metrics import GIB

if TYPE_CHECKING:  # pandas only where a table is built: a run's calibration record reads ``measured`` alone
    import pandas as pd

UNDER_PREDICTION_FLAG = 0.05  # memory under-predicted by more than this fraction is flagged
# What autograd and the optimizer hold on the CPU, as the memory breakdown records them: the predictor's static
# bytes (weights, gradients, optimizer state) and activation bytes (one micro-batch's saved activations).
CPU_PARTS = ("weights_frozen", "weights_trainable", "gradients", "optimizer_state", "activations_saved")
# The quantities, as the summary names them.
GPU_MEMORY = "peak memory per GPU"
CPU_MEMORY = "memory parts (CPU)"
SPEED = "tokens/s"
QUANTITIES = (GPU_MEMORY, CPU_MEMORY, SPEED)
ALL_METHODS = "all methods"
# Words for each way memory is measured (the comparison's ``memory_compared`` column).
TRAINING_PEAK = "training peak"  # memory_breakdown.training_peak
ALLOCATED_PEAK = "allocated peak"  # torch_peak_allocated
CPU_PARTS_COMPARED = "CPU parts"  # static + activations
CPU_PARTS_WORDS = ("On the CPU, which has no allocator peak, the prediction's static + activation bytes are compared "
                   "with the memory breakdown's weights + gradients + optimizer state + saved activations.")


def _number(value: Any) -> float | None:
    """A finite number, or None (missing, NaN, text, a bool)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _positive(value: Any) -> float | None:
    number = _number(value)
    return number if number is not None and number > 0 else None


def on_cpu(row: Mapping[str, Any]) -> bool:
    """Whether the run trained on the CPU (result.json's ``device``: "cpu"; "cuda", "cuda:0" otherwise)."""
    return str(row.get("device", "")).startswith("cpu")


def has_prediction(row: Mapping[str, Any]) -> bool:
    """Whether the run recorded a prediction. A run from before the record (or one the predictor did not reach)
    holds ``prediction: {}``, which flattens to no column at all (NaN in a frame with predicted runs)."""
    return any(_positive(row.get(f"prediction_{key}")) is not None for key in ("peak_bytes", "tokens_per_s",
                                                                             "static_bytes", "activation_bytes"))


def comparable(row: Mapping[str, Any]) -> bool:
    """A run whose prediction is compared: it finished ok and recorded a prediction."""
    return row.get("status") == "ok" and has_prediction(row)


def measured(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the run measured, in the prediction's terms: ``memory_bytes`` (None where not recorded),
    ``memory_compared`` (which figure, in words), ``tokens_per_s`` (global) and ``on_cpu``."""
    if on_cpu(row):
        # The CPU has no allocator peak, and host RSS is mostly imported libraries: compare the parts the predictor
        # computes (static + activations) with the breakdown's exact bytes of the same parts, all of them or none.
        parts = [_number(row.get(f"memory_breakdown_{part}")) for part in CPU_PARTS]
        memory = None if any(p is None for p in parts) else float(sum(parts))
        compared = CPU_PARTS_COMPARED
    else:
        # prediction.peak_bytes is the allocator's peak during training, loading excluded: the breakdown's
        # training_peak is exactly that; a run without it (older ones) has the whole run's allocated peak, which
        # can only be larger, where loading peaks above training.
        memory = _positive(row.get("memory_breakdown_training_peak"))
        compared = TRAINING_PEAK
        if memory is None:
            memory, compared = _positive(row.get("torch_peak_allocated")), ALLOCATED_PEAK
    return {"memory_bytes": memory, "memory_compared": compared if memory is not None else None,
            "tokens_per_s": _positive(row.get("tokens_per_s")), "on_cpu": on_cpu(row)}


def predicted(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the prediction said, in the same terms as ``measured``: on the CPU static + activation bytes, on a GPU
    the peak. A figure of 0 is the record's unset default, not a prediction (None)."""
    if on_cpu(row):
        static = _positive(row.get("prediction_static_bytes"))
        activations = _number(row.get("prediction_activation_bytes"))
        memory = None if static is None or activations is None else static + activations
    else:
        memory = _positive(row.get("prediction_peak_bytes"))
    return {"memory_bytes": memory, "tokens_per_s": _positive(row.get("prediction_tokens_per_s"))}


def relative_error(predicted_value: float | None, measured_value: float | None) -> float | None:
    """(predicted - measured) / measured; None when either is missing."""
    if predicted_value is None or not measured_value:
        return None
    return (predicted_value - measured_value) / measured_value


def errors(row: Mapping[str, Any]) -> dict[str, Any]:
    """One run's signed relative errors: ``memory_error``, ``tokens_per_s_error`` (None where not compared),
    ``memory_under_predicted`` (by more than 5%), ``memory_quantity`` (GPU peak or CPU parts) and
    ``memory_compared`` (the measured figure, in words). Every error is None for a run that is not ``comparable``."""
    if not comparable(row):
        return {"memory_error": None, "tokens_per_s_error": None, "memory_under_predicted": False,
                "memory_quantity": None, "memory_compared": None}
    got, said = measured(row), predicted(row)
    memory_error = relative_error(said["memory_bytes"], got["memory_bytes"])
    return {"memory_error": memory_error,
            "tokens_per_s_error": relative_error(said["tokens_per_s"], got["tokens_per_s"]),
            "memory_under_predicted": memory_error is not None and memory_error < -UNDER_PREDICTION_FLAG,
            "memory_quantity": CPU_MEMORY if got["on_cpu"] else GPU_MEMORY,
            "memory_compared": got["memory_compared"] if memory_error is not None else None}


def row_from_run_dir(path: str | Path) -> dict[str, Any]:
    """A run directory as the report's flat row (``ftprof.results.load.run_row``). Raises ValueError naming the
    file and the problem."""
    from ftprof.results.load import run_row

    return run_row(Path(path))


def row_from_records(result: Mapping[str, Any], config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """result.json and (optionally) config.json, as dicts, flattened as the report flattens a run directory's
    (the config's sections' options, then the result's fields over them)."""
    from ftprof.results.load import flat_row  # the report's own flattening, so the keys are the same

    return flat_row(dict(result), dict(config) if config else None)


def _frame(rows) -> pd.DataFrame:
    import pandas as pd

    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    return frame.reset_index(drop=True)


def _labels(frame: pd.DataFrame) -> pd.Series:
    """The report's run labels (method plus the options that vary between the ok runs; "#k" for repeats), or the
    run directory's name for rows without the configuration columns."""
    import pandas as pd

    names = frame.get("run_name", pd.Series([""] * len(frame), index=frame.index)).map(str)
    ok = frame[frame["status"] == "ok"] if "status" in frame else frame.iloc[0:0]
    if not len(ok) or "method" not in ok or "world_size" not in ok:
        return names
    from ftprof.results.labels import labels

    return names.where(~frame.index.isin(ok.index), labels(ok).reindex(frame.index))


def coverage(rows) -> dict[str, int]:
    """How many runs were compared, and why the others were not: ``compared`` (ok, with a prediction),
    ``no_prediction`` (ok runs without one), ``not_ok`` (runs with a prediction that did not finish ok)."""
    frame = _frame(rows)
    records = frame.to_dict("records")
    ok = [r for r in records if r.get("status") == "ok"]
    return {"compared": sum(has_prediction(r) for r in ok),
            "no_prediction": sum(not has_prediction(r) for r in ok),
            "not_ok": sum(has_prediction(r) and r.get("status") != "ok" for r in records)}


COMPARISON_COLUMNS = ("run", "run_name", "method", "device_name", "predicted_for", "memory_compared",
                      "predicted_memory_gib", "measured_memory_gib", "memory_error_pct", "memory_under_predicted",
                      "predicted_tokens_per_s", "measured_tokens_per_s", "tokens_per_s_error_pct", "memory_source",
                      "speed_source")
BYTES_COLUMNS = ("predicted_memory_bytes", "measured_memory_bytes")


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else 100.0 * fraction


def _gib(value: float | None) -> float | None:
    return None if value is None else value / GIB


def _comparison_row(row: Mapping[str, Any], label: str) -> dict[str, Any]:
    got, said, error = measured(row), predicted(row), errors(row)
    compared = error["memory_error"] is not None
    return {"run": label, "run_name": row.get("run_name"), "method": row.get("method"),
            "device_name": row.get("device_name"), "predicted_for": row.get("prediction_device"),
            "memory_compared": error["memory_compared"],
            "predicted_memory_gib": _gib(said["memory_bytes"]), "measured_memory_gib": _gib(got["memory_bytes"]),
            "memory_error_pct": _pct(error["memory_error"]),
            "memory_under_predicted": error["memory_under_predicted"] if compared else None,
            "predicted_tokens_per_s": said["tokens_per_s"], "measured_tokens_per_s": got["tokens_per_s"],
            "tokens_per_s_error_pct": _pct(error["tokens_per_s_error"]),
            "memory_source": row.get("prediction_memory_source"), "speed_source": row.get("prediction_speed_source"),
            "predicted_memory_bytes": said["memory_bytes"], "measured_memory_bytes": got["memory_bytes"]}


def comparison(rows, with_bytes: bool = False) -> pd.DataFrame:
    """One row per compared run (ok, with a prediction), in the rows' order: its label, predicted and measured
    memory (GiB) and tokens/s, the signed errors in percent, the prediction's sources. ``with_bytes`` adds the
    memory figures in bytes (``predicted_memory_bytes``, ``measured_memory_bytes``), as the report's CSV holds them."""
    import pandas as pd

    frame = _frame(rows)
    columns = list(COMPARISON_COLUMNS) + (list(BYTES_COLUMNS) if with_bytes else [])
    if not len(frame):
        return pd.DataFrame(columns=columns)
    names = _labels(frame)
    out = [_comparison_row(row, names[i]) for i, row in zip(frame.index, frame.to_dict("records"), strict=True)
           if comparable(row)]
    table = pd.DataFrame(out, columns=columns)
    table["memory_under_predicted"] = pd.Series([r["memory_under_predicted"] for r in out], dtype=object)
    for column in [c for c in BYTES_COLUMNS if c in table]:
        table[column] = pd.array([None if v is None else round(v) for v in table[column].map(_number)],
                                 dtype="Int64")
    return table


def _worst(errors_pct: pd.Series, names: pd.Series) -> tuple[float, str]:
    """The largest error in size, with its sign and its run (an under-prediction wins a tie)."""
    key = errors_pct.abs() + (errors_pct < 0) * 1e-9
    at = key.idxmax()
    return float(errors_pct[at]), str(names[at])


def _summary_line(quantity: str, method: str, errors_pct: pd.Series, names: pd.Series) -> dict[str, Any]:
    worst, worst_run = _worst(errors_pct, names)
    memory = quantity != SPEED
    return {"quantity": quantity, "method": method, "runs": int(len(errors_pct)),
            "median_abs_error_pct": float(errors_pct.abs().median()), "worst_error_pct": worst,
            "worst_run": worst_run,
            "under_predicted": int((errors_pct < -100 * UNDER_PREDICTION_FLAG).sum()) if memory else None}


SUMMARY_COLUMNS = ("quantity", "method", "runs", "median_abs_error_pct", "worst_error_pct", "worst_run",
                   "under_predicted")


def summarize(rows) -> pd.DataFrame:
    """Per quantity (peak memory per GPU, CPU memory parts, tokens/s) and per method, then over all methods: runs
    compared, median |error| and the worst signed error (percent) with its run's label, and for memory the runs
    under-predicted by more than 5% (None for tokens/s). Empty (with the columns) when nothing was compared."""
    import pandas as pd

    table = comparison(rows)
    memory_quantity = table["memory_compared"].map(
        lambda c: None if c is None or (isinstance(c, float) and math.isnan(c)) else
        CPU_MEMORY if c == CPU_PARTS_COMPARED else GPU_MEMORY) if len(table) else pd.Series(dtype=object)
    out = []
    for quantity in QUANTITIES:
        column = "tokens_per_s_error_pct" if quantity == SPEED else "memory_error_pct"
        mask = table[column].notna() if quantity == SPEED else memory_quantity == quantity
        chosen = table[mask] if len(table) else table
        if not len(chosen):
            continue
        errors_pct = pd.to_numeric(chosen[column])
        for method, group in chosen.groupby(chosen["method"].map(str), sort=True):
            out.append(_summary_line(quantity, method, errors_pct[group.index], chosen["run"]))
        out.append(_summary_line(quantity, ALL_METHODS, errors_pct, chosen["run"]))
    table = pd.DataFrame(out, columns=list(SUMMARY_COLUMNS))
    table["under_predicted"] = pd.Series([r["under_predicted"] for r in out], dtype=object)  # None for tokens/s
    return table
