"""The calibration store's records are checked as they are read (issue 41): a record of the wrong shape or with figures
no run has is skipped, counted in one warning line per store per process, and never believed; the planner's
look-ups work on what is left. Stores are planted as the engine writes them (one JSON line a record)."""

from __future__ import annotations

import json
import math

import pytest

from ftprof.plan import calibration, host, store
from ftprof.plan.calibration import ClassKey

H200 = "NVIDIA H200"
LORA = ClassKey("lora", "none", "eager", True)


def record(i: int = 0, **changes) -> dict:
    """A record as ``calibration.run_record`` writes it (llama-1b LoRA on an H200, 4 x 2048 tokens)."""
    flops, tokens_per_s = 7.8e9, 40_000.0 + i
    out = {
        "run_key": f"/runs/r{i}@2026-01-01T00:00:{i:02d}", "source": "run", "run_dir": f"/runs/r{i}",
        "finished_at": "2026-01-01T00:00:00+00:00", "device_name": H200, "versions": {"torch": "2.9.0"},
        "model": "llama-1b", "layers": 16, "method": "lora", "policy": "none", "checkpointed_layers": None,
        "kernels": "eager", "compile": True, "knobs": dict(calibration.DEFAULT_KNOBS), "seq_len": 2048,
        "batch_size": 4, "micro_batch_tokens": 8192, "grad_accum": 1, "world_size": 1, "parallel": None,
        "flops_per_token": flops, "recompute_flops_per_token": 0.0, "tokens_per_s": tokens_per_s,
        "flops_per_s": flops * tokens_per_s, "training_peak": 30 * 2**30,
        "prediction": {"peak_bytes": 28 * 2**30, "static_bytes": 10 * 2**30, "gradient_bytes": 2**30,
                       "activation_bytes": 16 * 2**30, "activation_factor": 1.0, "transient_bytes": 3 * 2**30,
                       "candidate": {"grad_accum": 1}},
        "gpu_busy": 0.97,
    }
    out.update(changes)
    return out


def plant(path, lines) -> None:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines))


# (case, a change to a good record (or a whole line), words the warning's reason holds)
BAD = [
    ("knobs a string", {"knobs": "compile_mode=default"}, "knobs is a string"),
    ("knobs a list", {"knobs": ["fp8_base"]}, "knobs is a list"),
    ("an option a list", {"knobs": {**calibration.DEFAULT_KNOBS, "fp8_base": [True]}}, "option fp8_base is a list"),
    ("method a list", {"method": ["lora"]}, "method is a list"),
    ("policy missing", {"policy": None}, "policy is null"),
    ("compile a string", {"compile": "yes"}, "compile is a string"),
    ("1e308 FLOP/s", {"flops_per_s": 1e308}, "beyond NVIDIA H200's peak"),
    ("over the peak by a little", {"flops_per_s": 1.0e15}, "beyond NVIDIA H200's peak"),
    ("tokens/s beyond the peak", {"tokens_per_s": 1e9}, "flops_per_token x tokens_per_s"),
    ("a CPU at 1e20", {"device_name": "cpu", "flops_per_s": 1e20}, "beyond cpu's peak"),
    ("infinite rate", {"flops_per_s": math.inf}, "flops_per_s is inf"),
    ("negative micro-batch", {"micro_batch_tokens": -8192}, "micro_batch_tokens is -8192"),
    ("half a token", {"micro_batch_tokens": 8192.5}, "not a whole number"),
    ("absurd flops per token", {"flops_per_token": 1e30}, "flops_per_token 1e+30 is beyond"),
    ("zero GPUs", {"world_size": 0}, "world_size is 0"),
    ("world a string", {"world_size": "1"}, "world_size is '1'"),
    ("seq_len a list", {"seq_len": [2048]}, "seq_len is [2048]"),
    ("zero layers", {"layers": 0}, "layers is 0"),
    ("model a number", {"model": 8}, "model is int"),
    ("prediction a string", {"prediction": "none"}, "prediction is a string"),
    ("candidate a list", {"prediction": {"candidate": [1]}}, "candidate is a list"),
    ("grad_accum a word", {"prediction": {"candidate": {"grad_accum": "two"}}}, "grad_accum is 'two'"),
    ("negative prediction", {"prediction": {"peak_bytes": -1}}, "peak_bytes is -1"),
    ("negative peak", {"training_peak": -5}, "training_peak is -5"),
    ("a petabyte-plus peak", {"training_peak": 10**18}, "training_peak is"),
    ("busy in percent", {"gpu_busy": 85}, "gpu_busy is 85"),
    ("negative host floor", {"host_floor_s": -1.0}, "host_floor_s is -1.0"),
    ("not an object", [1, 2], "a list, not a record"),
    ("binary", b"\xff\xfe\x00garbage", "not a JSON line"),
    ("cut short", b'{"run_key": "x", "meth', "not a JSON line"),
    ("nested too deep", b"[" * 100_000, "not a JSON line"),
]


def _bad_line(change):
    return change if isinstance(change, (bytes, list)) else record(9, **change)


@pytest.mark.parametrize("case,change,words", BAD, ids=[c[0] for c in BAD])
def test_a_bad_record_is_skipped_counted_and_never_believed(tmp_path, capsys, case, change, words):
    path = tmp_path / "calibration.jsonl"
    plant(path, [record(1), _bad_line(change), record(2)])
    records = calibration.load_records(path)
    assert [r["run_key"] for r in records] == [record(1)["run_key"], record(2)["run_key"]]
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"ftprof: calibration store {path}: skipped 1 record(s) that are damaged or not believable " \
           f"(first: line 2: " in err and words in err, err
    # the planner's look-ups answer from the good records alone
    rate = calibration.speed_rate(H200, LORA, 7.8e9, 8192, records=records)
    assert rate.runs == 2 and rate.flops_per_s == pytest.approx(7.8e9 * 40_001.5)
    calibration.activation_factor(LORA, records=records)
    host.host_floor(H200, LORA, 16, records)


def test_every_bad_record_together_counted_once_per_store(tmp_path, capsys):
    path, other = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    plant(path, [_bad_line(c) for _, c, _ in BAD] + [record(1)])
    plant(other, [record(1), {"method": "lora"}])
    assert len(calibration.load_records(path)) == 1
    assert len(calibration.load_records(path)) == 1  # read again: no second line
    assert len(calibration.load_records(other)) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert f"store {path}: skipped {len(BAD)} record(s)" in lines[0] and "first: line 1: knobs is a string" in lines[0]
    assert f"store {other}: skipped 1 record(s)" in lines[1] and "first: line 2: policy is missing" in lines[1]


def test_a_record_claiming_1e308_flops_is_not_ranked_first(tmp_path, capsys):
    path = tmp_path / "calibration.jsonl"
    plant(path, [record(1, flops_per_s=1e308), record(2)])
    rate = calibration.speed_rate(H200, LORA, 7.8e9, 8192, records=calibration.load_records(path))
    assert rate.runs == 1 and rate.flops_per_s == pytest.approx(7.8e9 * 40_002)
    assert "beyond NVIDIA H200's peak" in capsys.readouterr().err


def test_fp8_base_may_go_past_the_bf16_peak_but_not_twice_it(tmp_path):
    fp8 = {**calibration.DEFAULT_KNOBS, "fp8_base": True}
    assert store.problem(record(1, knobs=fp8, flops_per_s=1.2e15, tokens_per_s=1e5)) is None
    assert "peak" in store.problem(record(1, knobs=fp8, flops_per_s=2.5e15))
    assert store.problem(record(1, device_name="NVIDIA Unknown 9000", flops_per_s=5e15, tokens_per_s=1e5)) is None


def test_a_record_the_engine_writes_is_believed(tmp_path):
    assert store.problem(record(1)) is None
    cpu = record(2, device_name="cpu", training_peak=None, gpu_busy=None, prediction={}, layers=None, seq_len=None,
                 model=None, flops_per_s=2e9, tokens_per_s=0.25)
    assert store.problem(cpu) is None
    del cpu["prediction"], cpu["gpu_busy"]  # absent is as null
    assert store.problem(cpu) is None


def test_plan_reads_past_a_bad_record_and_ranks_by_the_good_one(tmp_path, monkeypatch, capsys):
    """Before: a well-formed record whose knobs were a string made every plan end in a traceback, and a record
    claiming 1e308 FLOP/s was ranked first."""
    from ftprof.cli.main import main

    path = tmp_path / "calibration.jsonl"
    cpu = {"device_name": "cpu", "model": "tiny", "layers": 2, "seq_len": 128, "micro_batch_tokens": 256,
           "flops_per_token": 1e6, "flops_per_s": 1e9, "tokens_per_s": 1000.0, "compile": False, "training_peak": None,
           "gpu_busy": None, "prediction": {}}
    plant(path, [record(1, **{**cpu, "knobs": "dtype=float32"}), record(2, **{**cpu, "flops_per_s": 1e308}),
                 record(3, **cpu)])
    monkeypatch.setenv(calibration.STORE_ENV, str(path))
    code = main(["plan", "lora", "--model", "tiny", "--device", "cpu", "--plan-dir", str(tmp_path / "plan"),
                 "--output-dir", str(tmp_path / "runs")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err.count(f"calibration store {path}: skipped 2 record(s)") == 1 and "Traceback" not in err
    rows = json.loads((tmp_path / "plan" / "plan.json").read_text())["rows"]
    sources = {r["speed_source"] for r in rows if r["method"] == "lora" and r["checkpointing"] == "none"}
    assert sources and all(s.startswith("local store: 1 run on cpu") for s in sources), sources
    assert max(r["tokens_per_s"] for r in rows if r["tokens_per_s"]) < 1e6  # the 1e308 record is not believed
