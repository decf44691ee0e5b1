"""Every method trains on the tiny preset on CPU, loss falls on the learnable synthetic task, files are complete."""

import csv
import json

import pytest

import ftprof
from ftprof import metrics
from ftprof.results.schema import STEP_COLUMNS
from tests.conftest import build_run, tiny_config
from tests.requires import method_param

LEARNING_RATES = {"full": 3e-3, "lora": 1e-2, "qlora": 1e-2, "gptq-lora": 1e-2}


@pytest.mark.parametrize("method", ["full", "lora", "qlora", method_param("gptq-lora", pytest.mark.slow)])
def test_method_trains_and_loss_falls(tmp_path, method):
    cfg = tiny_config(tmp_path, method, max_steps=25, seq_len=64, batch_size=8, lr=LEARNING_RATES[method],
                      measure_warmup_steps=2)
    result = ftprof.train(cfg)
    assert result.status == "ok", result.failure.error_tail
    assert result.run.steps_completed == 25 and result.throughput.steady_steps == 23
    assert result.throughput.loss_last < 0.85 * result.throughput.loss_first
    run = tmp_path / result.run_dir.split("/")[-1]
    assert run.is_dir()
    for name in ("config.json", "env.json", "steps.csv", "result.json", "memory_stages.csv"):
        assert (run / name).is_file(), name
    config = json.loads((run / "config.json").read_text())
    assert config["method"]["method"] == method and config["model"]["dtype"] == "float32"
    assert ftprof.RunConfig.from_dict(config).method.method == method
    with open(run / "steps.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 25 and list(rows[0]) == STEP_COLUMNS
    assert all(float(r["step_time_s"]) > 0 for r in rows)
    assert sum(r["warmup"] == "True" for r in rows) == 2
    saved = json.loads((run / "result.json").read_text())
    assert saved["status"] == "ok" and saved["tokens_per_s"] > 0
    assert saved["tokens_per_step"] == 8 * 64
    assert saved["real_tokens_per_s"] == pytest.approx(saved["tokens_per_s"] * 63 / 64)
    assert saved["host_peak_rss"] > 0 and saved["mfu"] is None  # CPU: no peak table entry, MFU left empty
    # the peak is never under an RSS the run recorded (each step's, on a CPU)
    assert saved["host_peak_rss"] >= max(int(r["mem_peak_allocated"]) for r in rows)
    if method == "full":
        assert saved["params_trainable"] == saved["params_total"]
    else:
        assert 0 < saved["params_trainable"] < saved["params_total"] * 0.5
    assert set(saved["memory_stages"]) >= {"mem_load_delta", "mem_first_forward_delta", "mem_steady_state_delta"}
    with open(run / "memory_stages.csv") as fh:
        stages = list(csv.DictReader(fh))
    assert all(int(st["peak_allocated"]) >= int(st["allocated_after"]) for st in stages)  # no peak under its end
    # host time by cause: the first step made its own batch; every cause fits inside its step
    assert float(rows[0]["data_s"]) > 0 and all(r["alloc_retries"] == "0" for r in rows)
    for r in rows:
        assert 0 <= float(r["data_s"]) + float(r["compile_s"]) < float(r["step_time_s"])
    steady_s = sum(float(r["step_time_s"]) for r in rows if r["warmup"] == "False")
    assert saved["host_time"]["steps_s"] == pytest.approx(steady_s)
    assert 0 < saved["host_time"]["data_s"] < steady_s
    if method == "gptq-lora":  # GPTQModel's torch kernel compiles itself at its first call, inside step 1
        # (not a share of step 1's excess: under a parallel suite on 2 cores the rest of the first call's costs
        # grew to half of it, and the share fell to 35%; nor a number of seconds: that is the machine's)
        compile_s = [float(r["compile_s"]) for r in rows]
        assert compile_s[0] > 0 and all(c < compile_s[0] for c in compile_s[1:]), compile_s
        # the slow steps result.json names are metrics.slow_steps of the steps recorded: whether step 1 is slow
        # enough to be named depends on the machine's load (CI, 2026-12-02: not named under the parallel suite);
        # the attribution itself is tests/test_metrics.py's
        recorded = [{"step": int(r["step"]), "warmup": r["warmup"] == "True", "step_time_s": float(r["step_time_s"]),
                     "profiler_phase": r["profiler_phase"], "alloc_retries": int(r["alloc_retries"]),
                     **{k: float(r[k]) for k in metrics.HOST_CAUSES}} for r in rows]
        named = [(s["step"], s["cause"]) for s in saved["slow_steps"]]
        assert named == [(s["step"], s["cause"]) for s in metrics.slow_steps(recorded)]


def test_env_records_versions_allocator_and_switches(tmp_path, monkeypatch):
    monkeypatch.setenv("FTPROF_LOSS_CHUNK_TOKENS", "1024")
    monkeypatch.delenv("FTPROF_LEAN_KERNELS", raising=False)
    result = ftprof.train(tiny_config(tmp_path, "lora", max_steps=2))
    env = json.loads((tmp_path / result.run_dir.split("/")[-1] / "env.json").read_text())
    assert env["packages"]["torch"] and env["packages"]["transformers"] and env["packages"]["peft"]
    assert env["pytorch_alloc_conf"] and env["alloc_conf_source"] in ("ftprof default", "environment", "option")
    assert env["switches"] == {"FTPROF_LEAN_KERNELS": None, "FTPROF_LOSS_CHUNK_TOKENS": "1024"}


def test_gradient_checkpointing_and_accumulation(tmp_path):
    result = ftprof.train(tiny_config(tmp_path, "lora", gradient_checkpointing=True, grad_accum=3, max_steps=3))
    assert result.status == "ok" and result.throughput.tokens_per_step == 3 * 4 * 32
    assert result.flops.recompute_flops_per_token > 0


def test_failure_is_a_recorded_status(tmp_path):
    # A LoRA target that does not exist fails inside setup: a user error, raised, yet recorded on disk.
    cfg = tiny_config(tmp_path, "lora", lora_targets="no_such_proj")
    with pytest.raises(ftprof.ConfigError, match="--lora-targets"):
        ftprof.train(cfg)
    (run,) = tmp_path.iterdir()
    assert json.loads((run / "result.json").read_text())["status"] == "error"


def test_text_dataset_from_python_api(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"the model trains on tokens {i}"}) for i in range(20)))
    result = ftprof.train(tiny_config(tmp_path, "full", dataset=str(data), packing=False, run_name="text"))
    assert result.status == "ok"
    assert result.throughput.real_tokens_per_s < result.throughput.tokens_per_s  # padding is not real tokens


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_memory_breakdown_is_exact(tmp_path, method):
    cfg = tiny_config(tmp_path, method, max_steps=2, measure_warmup_steps=1)
    result = ftprof.train(cfg)
    b = result.memory.memory_breakdown.to_dict()
    n_trainable = result.flops.params_trainable
    assert b["weights_trainable"] == 4 * n_trainable  # fp32 on CPU
    assert b["gradients"] == 4 * n_trainable
    assert b["optimizer_state"] >= 2 * 4 * n_trainable  # AdamW: exp_avg and exp_avg_sq (plus step counters)
    if method == "full":
        assert b["weights_frozen"] < 4 * 1024  # only buffers (rotary tables)
    elif method == "lora":
        assert b["weights_frozen"] >= 4 * (result.flops.params_total - n_trainable)
    else:  # 4-bit: half a byte per quantized weight plus its block constants, everything else in fp32
        import bitsandbytes as bnb

        _, built = build_run(tiny_config(tmp_path / "again", method, max_steps=2))
        quantized = sum(m.in_features * m.out_features for m in built.model.modules()
                        if isinstance(m, bnb.nn.Linear4bit))
        plain = sum(4 * p.numel() for m in built.model.modules() if not isinstance(m, bnb.nn.Linear4bit)
                    for p in m.parameters(recurse=False) if not p.requires_grad)
        buffers = sum(b_.numel() * b_.element_size() for b_ in built.model.buffers())
        per_weight = (b["weights_frozen"] - plain - buffers) / quantized
        assert 0.5 <= per_weight < 0.56  # 4 bits + NF4 absmax (one byte per 64 with double quant) + nested constants


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_checkpointing_really_shrinks_saved_activations(tmp_path):
    """HF models start in eval mode, where gradient checkpointing silently does nothing: ftprof calls train(),
    and the activations autograd keeps show it."""
    plain = ftprof.train(tiny_config(tmp_path / "a", "lora", max_steps=2, measure_warmup_steps=1, seq_len=128))
    ckpt = ftprof.train(tiny_config(tmp_path / "b", "lora", max_steps=2, measure_warmup_steps=1, seq_len=128,
                                    gradient_checkpointing=True))
    saved, saved_ckpt = (r.memory.memory_breakdown.activations_saved for r in (plain, ckpt))
    assert saved > 0 and saved_ckpt < 0.6 * saved


def test_logits_gradient_estimate_matches_the_h200_measurement():
    """llama-8b, 4 x 2048 tokens, vocab 128,256: the peak exceeded every measured part by 7.74 GiB (LoRA and QLoRA,
    with and without checkpointing; docs/measurements). The estimate must land within 2% of that."""
    from ftprof.metrics import logits_gradient_bytes

    assert logits_gradient_bytes(4 * 2048, 128256) / 2**30 == pytest.approx(7.74, rel=0.02)


def test_memory_breakdown_parts_against_a_peak():
    from ftprof.metrics import memory_breakdown

    static = {"weights_frozen": 100, "weights_trainable": 10, "gradients": 10, "optimizer_state": 20}
    out = memory_breakdown(static, 60, peak=250)
    assert out["transients"] == 50 and out["explained"] == pytest.approx(200 / 250) and out["training_peak"] == 250
    with_logits = memory_breakdown(static, 60, peak=250, logits_gradients=40)
    assert with_logits["transients"] == 10 and with_logits["explained"] == pytest.approx(240 / 250)
    # a fused or compiled loss never held the estimated fp32 gradients: at most what the peak leaves, no negative rest
    fused = memory_breakdown(static, 60, peak=250, logits_gradients=400)
    assert fused["logits_gradients"] == 50 and fused["transients"] == 0 and fused["explained"] == pytest.approx(1)
    assert memory_breakdown(static, 60, peak=None, logits_gradients=400)["logits_gradients"] == 400  # no peak
    assert "transients" not in memory_breakdown(static, 60, peak=None)  # CPU: no allocator peak
    assert memory_breakdown(None, 60, 250) == {}
    offloaded = memory_breakdown({**static, "offloaded": 1000}, 60, peak=250)  # host bytes: outside the peak
    assert offloaded["transients"] == 50 and offloaded["offloaded"] == 1000


