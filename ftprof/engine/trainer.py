"""One instrumented training loop for every method: setup, train_step, optimizer_step, teardown.

Forward, backward and the optimizer step run inside ``torch.profiler.record_function`` labels
(``ftprof/forward``, ``ftprof/backward``, ``ftprof/optimizer_step``) so traces show them.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import time
import traceback
from collections.abc import Callable, Iterator

import torch
from torch.profiler import record_function

from ftprof import metrics
from ftprof.config import RunConfig
from ftprof.data import count_tokens, make_batches
from ftprof.engine import aggregate, distributed
from ftprof.models.materialize import materialize_sharded
from ftprof.models.methods import LoadContext, get_strategy
from ftprof.models.tokenizer import build_tokenizer
from ftprof.preflight import Preflight
from ftprof.profiling.memory import MemoryTracker, SavedActivations, static_breakdown
from ftprof.profiling.noop import NullProfiler
from ftprof.results.env import collect_env
from ftprof.results.run_dir import RunDirWriter, default_run_name, make_run_dir
from ftprof.results.schema import RunResult, StepRecord
from ftprof.runtime import allocator_setting, torch_dtype

# Write steps.csv after every step for short runs, then every STEPS_FLUSH_EVERY steps (and at the end).
STEPS_FLUSH_EVERY = 10


def profiler_overhead(steps: list[StepRecord]) -> dict[str, float | None]:
    """Median active-step time against median unprofiled steady step (same run): the profiler's cost."""
    active = [s.step_time_s for s in steps if s.profiler_phase == "active" and not s.warmup]
    plain = [s.step_time_s for s in steps if s.profiler_phase in ("", "wait") and not s.warmup]
    a, p = metrics.step_stats(active), metrics.step_stats(plain)
    return {"active_step_p50_s": a and a.median, "unprofiled_step_p50_s": p and p.median,
            "profiler_overhead": a.median / p.median - 1.0 if a and p else None}


def logits_gradient_bytes(tokens: int, vocab: int) -> int:
    """Estimated transient of the loss's backward: the causal-LM loss upcasts the logits to fp32, and backward
    holds two fp32 logit-sized gradients at once (of the log-softmax output and of its input) before casting back
    to the run dtype. Checked on an H200 (llama-8b, 4 x 2048 tokens, vocab 128,256): 7.83 GiB estimated, 7.74 GiB
    measured as the peak above every other part, with and without checkpointing, for LoRA and QLoRA alike."""
    return 2 * 4 * tokens * vocab


# Stages whose allocator peaks belong to training (loading and quantizing a model can peak higher, once).
TRAINING_STAGES = ("first_forward", "first_backward", "first_optimizer_step", "steady_state")


def memory_breakdown(static: dict | None, activations: int | None, peak: int | None,
                     logits_gradients: int | None = None) -> dict:
    """Where the training peak went: the exact static parts, the activations saved by one micro-batch's forward,
    the estimated logits gradients, and the rest ("transients": backward temporaries, recomputed layers,
    dequantized weights, allocator rounding). ``explained`` = parts / peak (CUDA only); ``peak`` is the training
    peak (loading excluded), kept as ``training_peak``."""
    if not static:
        return {}
    out = dict(static)
    if activations is not None:
        out["activations_saved"] = activations
    if logits_gradients:
        out["logits_gradients"] = logits_gradients
    if peak:
        parts = sum(out.values())
        out["transients"] = peak - parts
        out["explained"] = parts / peak
        out["training_peak"] = peak
    return out


def _last_contiguous(steps: list[dict]) -> list[dict]:
    """The last run of consecutive step numbers (a profiled stretch in the middle splits the steady window)."""
    tail: list[dict] = []
    for s in steps:
        if tail and s["step"] != tail[-1]["step"] + 1:
            tail = []
        tail.append(s)
    return tail


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


class StepTimer:
    """Wall time of one optimizer step, with device synchronisation (CUDA events on GPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def start(self) -> None:
        if self.cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self._end.record()
            self._end.synchronize()  # sync point: the step's kernels must finish before we read the time
            return self._start.elapsed_time(self._end) / 1000.0
        return time.perf_counter() - self._t0


class Trainer:
    def __init__(self, pre: Preflight, *, log: Callable[[str], None] = print, profiler=None,
                 on_step: Callable[[StepRecord], None] | None = None):
        self.pre = pre
        self.cfg: RunConfig = pre.config
        self.device = pre.device
        self.dtype = torch_dtype(pre.dtype)
        self.log = log
        self.profiler = profiler or NullProfiler()
        self.on_step = on_step
        self.steps: list[StepRecord] = []
        self.memory = MemoryTracker(self.device)
        self.strategy = get_strategy(self.cfg.method.method)
        self.started_at = _now()
        self.dist = distributed.env_info()

    # ---------------------------------------------------------------- setup
    def setup(self) -> None:
        t0 = time.perf_counter()
        gc.collect()  # leftovers of earlier runs in this process must not count as this run's memory
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # libraries that use "the current device" (bitsandbytes) agree
        self._open_run_dir()
        self._start_nvml()
        torch.manual_seed(self.cfg.train.seed)  # same initial weights on every rank
        self.tokenizer = self._tokenizer()
        # Each rank reads a different stream of batches (data parallelism).
        self.batches: Iterator[dict] = make_batches(self.cfg.data, self.tokenizer, self.pre.source.config.vocab_size,
                                                    self.cfg.train.seed + self.dist.rank)
        # Under FSDP a preset is sharded while still on the meta device: no rank ever holds the whole model.
        defer = (self.dist.enabled and self.cfg.distributed.parallel == "fsdp" and self.pre.source.kind == "preset"
                 and self.strategy.can_defer_init)
        with self.memory.stage("load"):
            model = self.strategy.load(LoadContext(self.cfg, self.pre.source, self.device, self.dtype, self.tokenizer,
                                                   self._calibration, self.log, defer_init=defer))
        with self.memory.stage("method_setup"):
            self.model = self._prepare_model(model, defer)
            self.params = [p for p in self.model.parameters() if p.requires_grad]
            self.optimizer = self._optimizer()
        self._set_precision()
        self._count_flops()
        self.device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        self.timer = StepTimer(self.device)
        self.setup_time = time.perf_counter() - t0

    def _open_run_dir(self) -> None:
        cfg = self.cfg
        run_name = cfg.output.run_name
        if self.dist.enabled and run_name is None:  # every rank must write into the same directory
            run_name = distributed.all_gather_object(default_run_name(cfg.method.method, cfg.model.model))[0]
        self.run_dir = make_run_dir(cfg.output.output_dir, run_name, cfg.method.method, cfg.model.model)
        self.writer = RunDirWriter(self.run_dir, rank=self.dist.rank if self.dist.enabled else None)
        if self.dist.is_main:
            self.writer.write_config(cfg.to_dict())
            self.writer.write_env(collect_env(allocator_setting()))

    def _prepare_model(self, model, deferred: bool):
        """What trains (the method), checkpointing, train mode, and the data-parallel wrapper."""
        cfg = self.cfg
        model = self.strategy.apply(model, cfg)
        if cfg.model.gradient_checkpointing:
            # Non-reentrant checkpointing needs no input-grad trick for frozen embeddings (LoRA methods).
            # transformers 5.24 renamed the method; PEFT wrappers forward either name to the base model.
            kwargs = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if hasattr(model, "config"):
            model.config.use_cache = False
        model.train()  # HF models start in eval mode, where gradient checkpointing silently does nothing
        if self.dist.enabled:
            model = distributed.wrap(model, cfg, self.device, self.dtype)
        if deferred:
            std = float(getattr(self.pre.source.config, "initializer_range", 0.02))
            # FSDP2's CPU offload wants the shards in host memory from the start (seen on two H200s: it refuses
            # parameters materialized on the GPU).
            host = torch.device("cpu") if cfg.distributed.fsdp_cpu_offload else None
            materialize_sharded(model, self.device, std=std, seed=cfg.train.seed + self.dist.rank, params_on=host)
        return model

    def _set_precision(self) -> None:
        # Adapters are fp32 master weights: run their matmuls in the run dtype under autocast. The textbook recipe
        # (kbit_prepare) runs without autocast, as it was written to: its fp32 upcasts then cost what they cost.
        use_autocast = self.strategy.uses_lora and self.dtype != torch.float32 and not self.cfg.method.kbit_prepare
        self.autocast = (lambda: torch.autocast(self.device.type, dtype=self.dtype)) if use_autocast \
            else contextlib.nullcontext
        if use_autocast:
            # PEFT casts each adapter's input to the adapter dtype (fp32) and autocast casts it straight back to
            # bf16 for the matmul: two full activation copies per adapted projection (measured on an H200: 20% of
            # QLoRA's kernel time in copy kernels). Under autocast the cast is pointless; switch it off.
            for module in self.model.modules():
                if hasattr(module, "cast_input_dtype_enabled"):
                    module.cast_input_dtype_enabled = False

    def _count_flops(self) -> None:
        self.counts = metrics.count_params(self.model)
        layers, attn_dim = metrics.attention_dims(self.pre.source.config)
        seq = self.cfg.data.seq_len
        self.flops_token = metrics.flops_per_token(self.counts, layers, attn_dim, seq)
        self.recompute_token = 0.0
        if self.cfg.model.gradient_checkpointing:
            recomputed = metrics.recomputed_params(self.model)
            self.recompute_token = metrics.recompute_flops_per_token(recomputed, layers, attn_dim, seq)

    def _start_nvml(self) -> None:
        """NVML sampling (memory logging nvml/all) runs in its own process, watching this process's GPU."""
        self.nvml = None
        self.nvml_note = None
        if self.cfg.output.memory_logging not in ("nvml", "all"):
            return
        if self.device.type != "cuda":
            self.nvml_note = "NVML sampler skipped: the run is not on a GPU"
            return
        from ftprof.profiling.nvml import NvmlSampler

        uuid = str(torch.cuda.get_device_properties(self.device).uuid)
        uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        self.nvml_file = f"nvml_rank{self.dist.rank}.csv" if self.dist.enabled else "nvml.csv"
        self.nvml = NvmlSampler(self.run_dir / self.nvml_file, [uuid])
        self.nvml.start()

    def _stop_nvml(self, res: RunResult) -> None:
        if getattr(self, "nvml_note", None):
            res.notes.append(self.nvml_note)
        if getattr(self, "nvml", None) is None:
            return
        steady = _last_contiguous(metrics.steady_window([s.to_dict() for s in self.steps])[0])
        # One wall-clock window of the steps the headline comes from: energy of profiled steps (and of the trace
        # export between them) stays out, as it does from throughput.
        window = (steady[0]["started_unix"], steady[-1]["started_unix"] + steady[-1]["step_time_s"]) \
            if steady else None
        summary = self.nvml.stop(window)
        self.nvml = None
        res.nvml = summary
        res.nvml_device_used_peak = summary.get("device_used_peak")
        res.nvml_process_used_peak = summary.get("process_used_peak")
        if window is not None and summary.get("energy_j") is not None:
            res.energy_per_token_j = summary["energy_j"] / sum(s["tokens"] for s in steady)
        if res.nvml_process_used_peak is not None and res.torch_peak_reserved is not None:
            res.non_torch_overhead = res.nvml_process_used_peak - res.torch_peak_reserved
        if "error" in summary:
            res.notes.append(f"NVML sampler failed: {summary['error']}")
        else:
            res.artifacts["nvml"] = self.nvml_file

    def _tokenizer(self):
        if self.pre.source.kind == "preset":
            return build_tokenizer()
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(self.pre.source.name)
        except Exception:  # noqa: BLE001 - a checkpoint without a tokenizer still trains on synthetic data
            if self.cfg.data.dataset != "synthetic":
                raise
            self.log("no tokenizer beside the model; using ftprof's built-in tokenizer for synthetic data")
            return build_tokenizer()
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return tok

    def _calibration(self) -> list[torch.Tensor]:
        """GPTQ calibration sequences, from the run's own data stream (a fresh iterator, same seed)."""
        n = self.cfg.method.gptq_calibration_samples
        stream = make_batches(self.cfg.data, self.tokenizer, self.pre.source.config.vocab_size, self.cfg.train.seed)
        rows: list[torch.Tensor] = []
        while len(rows) < n:
            batch = next(stream)
            for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=False):
                rows.append(ids[mask.bool()])
        return rows[:n]

    def _optimizer(self) -> torch.optim.Optimizer:
        t = self.cfg.train
        if t.optimizer == "paged_adamw_8bit":
            import bitsandbytes as bnb

            return bnb.optim.PagedAdamW8bit(self.params, lr=t.lr, weight_decay=t.weight_decay)
        fused = self.device.type == "cuda" and all(p.is_floating_point() for p in self.params)
        return torch.optim.AdamW(self.params, lr=t.lr, weight_decay=t.weight_decay, fused=fused or None)

    # ---------------------------------------------------------------- one step
    def _stage(self, name: str, first: bool):
        return self.memory.stage(name) if first else contextlib.nullcontext()

    def train_step(self, first: bool = False) -> tuple[torch.Tensor, int, int]:
        """Forward and backward over grad_accum micro-batches. Returns (summed loss tensor, tokens, real tokens)."""
        accum = self.cfg.train.grad_accum
        loss_sum = torch.zeros((), device=self.device)
        tokens = real = 0
        for micro in range(accum):
            batch = next(self.batches)
            n, r = count_tokens(batch)
            tokens, real = tokens + n, real + r
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            meter = self._activation_meter(first and micro == 0)
            with self._stage("first_forward", first and micro == 0), record_function("ftprof/forward"), \
                    self.autocast(), meter:
                loss = self.model(**batch).loss
            if isinstance(meter, SavedActivations):
                self.saved_activations = meter.bytes
            with self._stage("first_backward", first and micro == 0), record_function("ftprof/backward"):
                (loss / accum).backward()
            loss_sum += loss.detach()
        return loss_sum / accum, tokens, real

    def _activation_meter(self, on: bool):
        # FSDP2 keeps gathered parameters alive through forward: their storages would be miscounted as activations.
        if not on or (self.dist.enabled and self.cfg.distributed.parallel == "fsdp"):
            return contextlib.nullcontext()
        return SavedActivations(self.model)

    def optimizer_step(self, first: bool = False) -> None:
        with self._stage("first_optimizer_step", first), record_function("ftprof/optimizer_step"):
            if self.cfg.train.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(self.params, self.cfg.train.max_grad_norm)
            self.optimizer.step()
            if first:  # gradients and optimizer state both exist now: the one moment to size them
                self.static_memory = static_breakdown(self.model, self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)

    def step(self, index: int) -> StepRecord:
        first = index == 1
        phase = self.profiler.phase(index)
        started = time.time()
        self.memory.reset_peak()
        self.timer.start()
        loss, tokens, real = self.train_step(first)
        self.optimizer_step(first)
        seconds = self.timer.stop()
        mem = self.memory.current()
        record = StepRecord(step=index, loss=float(loss), step_time_s=seconds, tokens=tokens, real_tokens=real,
                            lr=self.cfg.train.lr, warmup=index <= self.cfg.train.warmup_steps,
                            profiler_phase=phase, started_unix=started,
                            mem_allocated=mem["allocated"], mem_peak_allocated=mem["peak_allocated"],
                            mem_reserved=mem["reserved"], mem_peak_reserved=mem["peak_reserved"])
        self.steps.append(record)
        return record

    # ---------------------------------------------------------------- loop
    def train_loop(self) -> None:
        max_steps = self.cfg.train.max_steps
        steady_before = None
        with self.profiler:
            for index in range(1, max_steps + 1):
                if index == 2:
                    steady_before = self.memory._allocated()
                    self.memory.reset_peak()
                record = self.step(index)
                self.profiler.step()
                if index <= 50 or index % STEPS_FLUSH_EVERY == 0 or index == max_steps:
                    self.writer.write_steps(self.steps)
                if self.on_step:
                    self.on_step(record)
        if steady_before is not None:
            self.memory.close_stage("steady_state", steady_before)

    # ---------------------------------------------------------------- results
    def result(self, status: str, exc: BaseException | None = None) -> RunResult:
        cfg = self.cfg
        res = RunResult(status=status, run_dir=str(getattr(self, "run_dir", "")), method=cfg.method.method,
                        model=cfg.model.model, device=str(self.device),
                        device_name=getattr(self, "device_name", str(self.device)), started_at=self.started_at,
                        finished_at=_now(), steps_completed=len(self.steps), seq_len=cfg.data.seq_len,
                        batch_size=cfg.data.batch_size, grad_accum=cfg.train.grad_accum,
                        setup_time_s=getattr(self, "setup_time", None))
        self._fill_throughput(res)
        self._fill_memory(res)
        if exc is not None:
            res.error_type = type(exc).__name__
            res.error_message = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else type(exc).__name__
            res.error_tail = "".join(traceback.format_exception(exc)[-8:])[-4000:]
        res.artifacts = {"config": "config.json", "env": "env.json", "steps": "steps.csv",
                         **self.profiler.artifacts()}
        self._stop_nvml(res)
        res.notes.extend(self.pre.notes)
        if self.profiler.enabled:
            res.profiling = {**self.profiler.resolved(), **profiler_overhead(self.steps)}
            res.notes.extend(res.profiling.get("notes", []))
        return res

    def _fill_throughput(self, res: RunResult) -> None:
        if self.steps:
            res.loss_first, res.loss_last = self.steps[0].loss, self.steps[-1].loss
            res.tokens_per_step = self.steps[-1].tokens
        res.warmup_step_times_s = [s.step_time_s for s in self.steps if s.warmup]
        steady, left_out = metrics.steady_window([s.to_dict() for s in self.steps])
        if left_out:
            res.notes.append(f"steady-state figures from {len(steady)} unprofiled steps ({left_out} profiled steps "
                             "left out)")
        if hasattr(self, "counts"):
            res.params_total, res.params_trainable = self.counts.total, self.counts.trainable_total
            res.params_trainable_matmul, res.params_frozen_matmul = (self.counts.trainable_matmul,
                                                                     self.counts.frozen_matmul)
            res.flops_per_token, res.recompute_flops_per_token = self.flops_token, self.recompute_token
            res.peak_flops = metrics.peak_flops(self.device_name) if self.device.type == "cuda" else None
        figures = metrics.steady_figures(steady, res.world_size, res.flops_per_token, res.recompute_flops_per_token,
                                         res.peak_flops)
        if figures is None:
            if self.steps:
                res.notes.append("every step was a warm-up step: no steady-state figures")
            return
        for key, value in figures.items():
            setattr(res, key, value)

    def _fill_memory(self, res: RunResult) -> None:
        cfg = self.cfg
        summary = self.memory.summary()
        res.torch_peak_allocated = summary.pop("torch_peak_allocated")
        res.torch_peak_reserved = summary.pop("torch_peak_reserved")
        res.host_peak_rss = summary.pop("host_peak_rss")
        res.memory_stages = summary
        if res.torch_peak_reserved is not None and res.torch_peak_allocated is not None:
            res.fragmentation = res.torch_peak_reserved - res.torch_peak_allocated
        training = [summary.get(f"mem_{stage}_peak") for stage in TRAINING_STAGES]
        training_peak = max((p for p in training if p is not None), default=None)
        vocab = getattr(self.pre.source.config, "vocab_size", None)
        logits = logits_gradient_bytes(cfg.data.batch_size * cfg.data.seq_len, vocab) if vocab else None
        res.memory_breakdown = memory_breakdown(getattr(self, "static_memory", None),
                                                getattr(self, "saved_activations", None), training_peak, logits)

    def release(self) -> None:
        """Free the model and optimizer now, so a next run in the same process starts from an empty device."""
        for name in ("model", "optimizer", "params", "batches"):
            self.__dict__.pop(name, None)
        gc.collect()  # PEFT wrappers hold reference cycles: without this the weights outlive the run
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def aggregate_ranks(self, res: RunResult) -> RunResult:
        """Collective: every rank sends its figures; rank 0 returns the run's aggregate (others: their own)."""
        payload = {"rank": self.dist.rank, "steps": [s.to_dict() for s in self.steps],
                   "summary": {k: getattr(res, k) for k in aggregate.RANK_FIELDS}, "nvml": res.nvml}
        gathered = distributed.all_gather_object(payload)
        if not self.dist.is_main:
            return res
        rows = aggregate.aggregate_steps([g["steps"] for g in gathered])
        self.writer.write_aggregate_steps(rows)
        return aggregate.aggregate_result(res, gathered, rows, self.cfg.distributed.parallel)

    def teardown(self, result: RunResult) -> RunResult:
        if hasattr(self, "writer"):
            self.writer.write_steps(self.steps)
            self.writer.write_memory_stages(self.memory.stage_rows())
            if self.dist.enabled:
                self.writer.write_result(result, rank_file=True)
            if self.dist.is_main:
                self.writer.write_result(result)
        return result
