"""The resolved run: a run's configuration as it will go, resolved once by ``ftprof.preflight`` before anything big
loads, and read by every part after it (the engine, the probe that builds a model the way the run does).

Not to be confused with ``ftprof.plan`` (the predictor package) or ``ftprof plan`` (the command): this is one run's
facts, not a prediction or a ranking.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ftprof.config import RunConfig
from ftprof.models.source import ModelSource
from ftprof.ranks import DistInfo


@dataclass
class ResolvedRun:
    """The configuration with defaults filled in, where the model comes from, the device and dtype, the
    checkpointing policy that runs (``--checkpointing auto``'s choice written here once), and the facts about the
    run that every part asks."""

    source: ModelSource
    device: object  # torch.device
    dtype: str  # resolved dtype name
    config: RunConfig  # with method defaults, dtype and profiling steps filled in (checkpointing as the user gave it)
    dist: DistInfo  # this process's place among the run's processes (rank 0 of 1 outside torchrun)
    shards: bool  # whether FSDP2 wraps the model (engine.distributed.shards)
    notes: list[str] = field(default_factory=list)  # adjustments the user should hear about
    tokenizer: object = None  # loaded here for real data (None for synthetic runs: the trainer picks one)
    data: object = None  # ftprof.data.PreparedData for real data: tokenized, checked, with its stats
    eval_data: object = None  # ftprof.data.PreparedData of --eval-dataset / --eval-split (None: none, or synthetic)
    prediction: object = None  # ftprof.results.parts.Prediction: peak memory and tokens/s, before anything loads
    auto_choice: object = None  # ftprof.results.parts.AutoChoice: what --checkpointing auto chose (else None)

    @property
    def device_type(self) -> str:
        return self.device.type  # "cuda" or "cpu"

    @property
    def world_size(self) -> int:
        return self.dist.world_size  # processes in this run

    @property
    def policy(self) -> str:
        """The checkpointing policy that runs: none, selective or full (auto's choice under auto)."""
        return policy_of(self.config, self.auto_choice)[0]

    @property
    def checkpointed_layers(self) -> int | None:
        """How many decoder layers the policy applies to (None: all of them)."""
        return policy_of(self.config, self.auto_choice)[1]

    @property
    def selective_rest(self) -> bool:
        """Whether the layers partial full checkpointing leaves out are selective-checkpointed: --selective-rest, or
        --checkpointing auto's choice."""
        return selective_rest_of(self.config, self.auto_choice)

    @property
    def lean_recompute(self) -> bool:
        """Whether checkpointing's recomputation leaves out the output projection's base matmul: --lean-recompute
        under a policy that recomputes, or --checkpointing auto's choice."""
        return lean_recompute_of(self.config, self.auto_choice)

    @property
    def lean_activations(self) -> bool:
        """Whether the layers that keep their activations keep no SwiGLU product: --lean-activations, or
        --checkpointing auto's choice (it tries it where no checkpointing fits only with it)."""
        return self._lean("lean_activations")

    @property
    def lean_norms(self) -> bool:
        """Whether the norms feeding shared A matmuls keep their input, not their output: --lean-norms, or auto's
        choice (as --lean-activations)."""
        return self._lean("lean_norms")

    def _lean(self, name: str) -> bool:
        chosen = self.config.model.checkpointing == "auto" and bool(getattr(self.auto_choice, name, False))
        return bool(getattr(self.config.method, name, False)) or chosen

    @property
    def offload_checkpoints(self) -> bool:
        """Whether full checkpointing's saved layer inputs wait in pinned host memory: --offload-checkpoints, or
        --checkpointing auto's choice (it tries the offload on CUDA where full checkpointing needs it)."""
        return offload_of(self.config, self.auto_choice)

    @property
    def offload_embeddings(self) -> bool:
        """Whether the input embedding table lives in host memory: --offload-embeddings, or --checkpointing auto's
        choice (it tries the table on CUDA where that lets a faster policy, or fewer recomputed layers, fit)."""
        return embeddings_offloaded(self.config, self.auto_choice)


def policy_of(cfg: RunConfig, auto_choice=None) -> tuple[str, int | None]:
    """(policy, checkpointed layers or None for all) of a configuration: under auto, the choice made for it."""
    m = cfg.model
    if m.checkpointing == "auto":
        if auto_choice is None:
            raise ValueError("--checkpointing auto has not chosen yet (preflight chooses before the model loads)")
        return auto_choice.policy, auto_choice.layers
    policy = m.checkpointing or ("full" if m.gradient_checkpointing else "none")
    return policy, m.checkpoint_layers if policy in ("full", "selective") else None


def selective_rest_of(cfg: RunConfig, auto_choice=None) -> bool:
    """Whether a configuration runs the layers partial full checkpointing leaves out under selective: under auto,
    the choice made for it."""
    if cfg.model.checkpointing == "auto":
        if auto_choice is None:
            raise ValueError("--checkpointing auto has not chosen yet (preflight chooses before the model loads)")
        return auto_choice.policy == "full" and auto_choice.layers is not None and \
            bool(getattr(auto_choice, "selective_rest", False))
    return bool(cfg.model.selective_rest)


def lean_recompute_of(cfg: RunConfig, auto_choice=None) -> bool:
    """Whether a configuration's recomputation skips the output projection's base matmul: asked (and a policy
    recomputes), or auto's choice."""
    policy = policy_of(cfg, auto_choice)[0]
    chosen = cfg.model.checkpointing == "auto" and bool(getattr(auto_choice, "lean_recompute", False))
    return policy != "none" and (bool(cfg.model.lean_recompute) or chosen)


def offload_of(cfg: RunConfig, auto_choice=None) -> bool:
    """Whether a configuration offloads full checkpointing's layer inputs: under auto, the choice made for it."""
    if cfg.model.checkpointing == "auto":
        if auto_choice is None:
            raise ValueError("--checkpointing auto has not chosen yet (preflight chooses before the model loads)")
        return auto_choice.policy == "full" and bool(getattr(auto_choice, "offload", False))
    return bool(cfg.model.offload_checkpoints)


def embeddings_offloaded(cfg: RunConfig, auto_choice=None) -> bool:
    """Whether a configuration keeps the input embedding table in host memory: asked, or auto's choice."""
    chosen = cfg.model.checkpointing == "auto" and bool(getattr(auto_choice, "host_embeddings", False))
    return bool(cfg.model.offload_embeddings) or chosen
