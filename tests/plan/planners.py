"""Planners built by hand for tests: a configuration's planner and candidate in one call, with the method defaults
resolved as for a preset, where tests would otherwise repeat the recipe (and the H200 target) each time."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ftprof.config import RunConfig
from ftprof.models.source import resolve_model_source
from ftprof.plan.candidates import Candidate, of_config
from ftprof.plan.predict import Planner, Target

H200 = Target("NVIDIA H200", capability=(9, 0))


def planner_for(model: str, method: str, *, seq_len: int, batch_size: int, dtype: str = "bfloat16",
                target: Target = H200, records: Sequence[dict] = (), **flat) -> tuple[Planner, Candidate]:
    """A planner for ``model`` trained with ``method`` and the other flat options, planning in ``dtype`` (the
    configuration's --dtype stays at its default) for ``target`` with exactly ``records`` as its calibration store,
    and the candidate of that configuration. The method's defaults are resolved for ``dtype`` as for a preset."""
    cfg = RunConfig.from_flat({"model": model, "method": method, "seq_len": seq_len, "batch_size": batch_size,
                               **flat})
    cfg = dataclasses.replace(cfg, method=cfg.method.resolved(dtype, preset=True))
    return Planner(cfg, resolve_model_source(model), dtype, target, list(records)), of_config(cfg)
