"""Activation checkpointing in a run (``--checkpointing none|full|selective|auto``): the policy the resolved run
says runs, applied to the built model. The policies themselves, and what each saves, are ftprof/models/checkpointing.py.

- ``auto``: the first of none > selective > full (on the N fewest layers, or every layer; on CUDA also with
  ``--offload-checkpoints``, taken where it lets fewer layers be recomputed or only it fits) whose predicted peak
  fits the memory this process can have, with a margin: chosen before the model loads by ftprof.plan (the
  predictor ``ftprof plan`` and every run's recorded prediction use; ftprof/plan/budget.py) and written once into
  the resolved run (``ResolvedRun.policy``, ``.checkpointed_layers``, ``.offload_checkpoints``); everything after
  reads it there.
"""

from __future__ import annotations

from ftprof.models.checkpointing import SelectivePolicy, apply_policy
from ftprof.resolved import ResolvedRun
from ftprof.results.parts import AutoChoice  # what auto chose, as result.json records it


def resolve_policy(model, run: ResolvedRun) -> tuple[str, int | None, AutoChoice | None, SelectivePolicy | None]:
    """Apply the policy that runs (under auto, the one ftprof.plan chose before the model loaded). Returns (policy,
    how many layers are checkpointed or None for all, the auto choice or None, the selective policy object, whose
    counter sizes what selective checkpointing caches, or None; under --selective-rest, that of the layers full
    checkpointing leaves out)."""
    policy, layers = run.policy, run.checkpointed_layers
    rest = run.selective_rest
    selective = SelectivePolicy(run.config.method.lora_r or 0) if policy == "selective" or rest else None
    apply_policy(model, policy, selective, layers, offload=run.offload_checkpoints, selective_rest=rest,
                 lean=run.lean_recompute, compiled=bool(run.config.model.compile))
    return policy, layers, run.auto_choice, selective
