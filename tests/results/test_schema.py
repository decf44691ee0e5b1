"""RunResult is made of parts, and result.json stays what it was: the same flat keys, in the same order, with the
same values; results written before the parts existed read back to the same dict."""

import json
from pathlib import Path

import pytest

from ftprof import metrics
from ftprof.results.parts import (
    AutoChoice,
    Checkpointing,
    Compile,
    CompileOutcome,
    DataStats,
    Distributed,
    Failure,
    Flops,
    HostTime,
    HostTimeTotals,
    Memory,
    MemoryBreakdown,
    NvmlSummary,
    RunIdentity,
    Throughput,
)
from ftprof.results.schema import RunResult, failure_result

DATA = Path(__file__).parent / "data"

# result.json's keys as the flat RunResult wrote them (schema_version 1), in its order.
FLAT_KEYS_V1 = [
    "status", "run_dir", "method", "model", "device", "device_name", "world_size", "parallel", "started_at",
    "finished_at", "steps_completed", "seq_len", "batch_size", "grad_accum", "tokens_per_step", "tokens_per_s",
    "tokens_per_s_per_gpu", "real_tokens_per_s", "real_tokens_per_s_per_gpu", "step_time_p50_s", "step_time_p90_s",
    "step_time_mean_s", "step_time_std_s", "steady_steps", "warmup_step_times_s", "loss_first", "loss_last",
    "host_time", "slow_steps", "params_total", "params_trainable", "params_trainable_matmul", "params_frozen_matmul",
    "flops_per_token", "recompute_flops_per_token", "peak_flops", "mfu", "hfu", "torch_peak_allocated",
    "torch_peak_reserved", "host_peak_rss", "nvml_device_used_peak", "nvml_process_used_peak", "non_torch_overhead",
    "fragmentation", "memory_stages", "memory_breakdown", "nvml", "energy_per_token_j", "setup_time_s",
    "checkpointing_policy", "checkpointed_layers", "checkpointing_auto", "kept_dequantized", "kernels_applied",
    "compile", "sdpa_backend_used", "compile_time_s", "data", "per_rank", "step_time_skew", "memory_skew",
    "error_type", "error_message", "error_tail", "artifacts", "profiling", "notes", "schema_version",
]

# Keys added since (additive: a reader of version 1 skips them), with what a run that did not do it holds.
ADDED = {"eval_loss_first": None, "eval_loss_last": None, "eval_loss_best": None, "eval_loss_best_step": None,
         "eval_runs": 0, "eval_time_s": None, "eval_tokens": None,
         "saved": None, "save_dir": None, "save_base_dir": None, "save_time_s": None, "training_proof": {},
         "prediction": {}}
# auto's memory and recomputation choices
ADDED_TO_AUTO = {"offload": False, "host_embeddings": False, "selective_rest": False, "lean_recompute": False,
                 "lean_activations": False, "lean_norms": False}
# keys added inside a part, after the key named
ADDED_AFTER = {"kept_dequantized": {"split_layers": None}, "compile_time_s": {"loss_chunk_tokens": None}}
_AT = FLAT_KEYS_V1.index("artifacts")
FLAT_KEYS = [k for key in FLAT_KEYS_V1[:_AT] for k in [key, *ADDED_AFTER.get(key, {})]] + list(ADDED) \
    + FLAT_KEYS_V1[_AT:]


def _with_added(old: dict) -> dict:
    """A version-1 result as this version writes it: the same keys, values and order, the added keys in place."""
    items = [item for key, value in old.items() for item in [(key, value), *ADDED_AFTER.get(key, {}).items()]]
    at = [key for key, _ in items].index("artifacts")
    out = dict(items[:at] + list(ADDED.items()) + items[at:])
    if out.get("checkpointing_auto"):  # records' keys added since, at their end
        out["checkpointing_auto"] = {**out["checkpointing_auto"], **ADDED_TO_AUTO}
    return out


# Written by the flat RunResult: every field set; a CPU run of the tiny preset (auto checkpointing); a failure.
V1_FILES = ["result_v1_populated.json", "result_v1_cpu_run.json", "result_v1_failure.json"]


def _populated() -> RunResult:
    """Every part set, as the engine sets them."""
    return RunResult(
        status="ok", run_dir="/runs/r",
        run=RunIdentity("qlora", "llama-1b", "cuda:0", "NVIDIA H200", world_size=2, parallel="fsdp",
                        started_at="a", finished_at="b", steps_completed=8, seq_len=128, batch_size=4, grad_accum=2),
        throughput=Throughput(1024, 900.0, 450.0, 880.0, 440.0, 0.5, 0.9, 0.55, 0.1, 7, [1.5], 1.9, 1.2),
        host_time=HostTime(HostTimeTotals(0.0, 0.3, 0.07, 0, 3.8), [{"step": 5, "cause": "gc"}]),
        flops=Flops(10, 8, 7, 3, 6e9, 2e9, 989e12, 0.4, 0.5),
        memory=Memory(3, 4, 5, 6, 7, 1, 1, {"mem_load_delta": 1}, MemoryBreakdown(weights_frozen=1, gradients=2)),
        nvml=NvmlSummary({"samples": 3, "energy_j": 1.0}, 0.01),
        setup_time_s=1.5,
        checkpointing=Checkpointing("full", 2, AutoChoice("full", "why", 2), 4),
        compile=Compile(["rms_norm"], CompileOutcome(blocks=2, compiled=True), "flash", 30.0),
        data=DataStats(dataset="d.jsonl", rows=5),
        distributed=Distributed({"0": {"tokens_per_s": 1.0}}, 0.1, 0.05),
        failure=Failure("E", "m", "t"),
        artifacts={"config": "config.json"}, profiling={"profile": True}, notes=["n"])


def test_a_populated_result_flattens_to_the_v1_keys_in_their_order():
    flat = _populated().to_dict()
    assert list(flat) == FLAT_KEYS
    assert flat["host_time"] == {"compile_s": 0.0, "gc_s": 0.3, "data_s": 0.07, "alloc_retries": 0, "steps_s": 3.8}
    assert flat["memory_breakdown"] == {"weights_frozen": 1, "gradients": 2}  # measured parts only
    assert flat["nvml"] == {"samples": 3, "energy_j": 1.0} and flat["compile"]["blocks"] == 2
    assert flat["data"]["dataset"] == "d.jsonl" and flat["checkpointing_auto"]["layers"] == 2


def test_unmeasured_records_are_empty_objects_as_before():
    flat = RunResult("ok", "/r", RunIdentity("lora", "tiny", "cpu", "cpu")).to_dict()
    assert list(flat) == FLAT_KEYS
    for key in ("host_time", "memory_breakdown", "checkpointing_auto", "compile", "data", "nvml", "per_rank",
                "prediction"):
        assert flat[key] == {}, key


@pytest.mark.parametrize("name", V1_FILES)
def test_v1_result_files_round_trip(name):
    old = json.loads((DATA / name).read_text())
    assert list(old) == FLAT_KEYS_V1
    again = RunResult.from_dict(old).to_dict()
    assert again == _with_added(old) and list(again) == FLAT_KEYS
    assert json.dumps(again) == json.dumps(_with_added(old))  # same types too (no int turned float, no tuple)


def test_failure_result_is_what_it_was(tmp_path):
    from tests.conftest import tiny_config

    cfg = tiny_config(tmp_path, "qlora")
    res = failure_result(cfg, "/x", "timeout", "timeout", "timed out after 5 s", "tail\nlines", "recorded")
    old = json.loads((DATA / "result_v1_failure.json").read_text())
    assert res.to_dict() == _with_added(old) | {"schema_version": 2}  # config meanings moved on (warm-ups)


def test_records_hold_every_key_their_producers_write():
    steps = [dict(step=i, step_time_s=0.5, data_s=0.0, gc_s=0.0, compile_s=0.0, alloc_retries=0) for i in (1, 2)]
    assert list(HostTimeTotals.from_dict(metrics.host_time(steps)).to_dict()) == list(metrics.host_time(steps))
    static = {"weights_frozen": 1, "weights_trainable": 2, "gradients": 3, "optimizer_state": 4, "offloaded": 5}
    breakdown = metrics.memory_breakdown(static, 6, 100, 7)
    assert MemoryBreakdown.from_dict(breakdown).to_dict() == breakdown

    np = pytest.importorskip("numpy")
    from ftprof.data.prepare import sequence_stats

    stats = sequence_stats(np.array([0, 3, 5]), np.array([1, -100, 2, 3, 4]), 4, packing=False)
    assert set(stats) <= set(DataStats().to_dict())


def test_a_key_that_moved_into_a_part_says_where():
    res = RunResult.from_dict(json.loads((DATA / "result_v1_populated.json").read_text()))
    assert res.throughput.tokens_per_s and res.memory.torch_peak_allocated and res.compile.outcome.compiled
    with pytest.raises(AttributeError, match=r"result\.throughput\.tokens_per_s"):
        res.tokens_per_s  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        res.nonsense  # noqa: B018
