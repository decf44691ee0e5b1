import subprocess
import sys
from pathlib import Path

import pytest

from ftprof.cli.common import config_from_args, option_names
from ftprof.cli.main import build_parser, main

REQUIRED_OPTIONS = ["--model", "--dataset", "--seq-len", "--batch-size", "--grad-accum", "--max-steps",
                    "--warmup-steps", "--lr", "--seed", "--dtype", "--gradient-checkpointing", "--packing",
                    "--optimizer", "--lora-r", "--lora-alpha", "--lora-dropout", "--lora-targets", "--quant-type",
                    "--double-quant", "--compute-dtype", "--gptq-bits", "--gptq-group-size", "--gptq-backend",
                    "--output-dir", "--run-name", "--device"]


def test_common_group_has_every_required_option():
    names = option_names()
    assert [o for o in REQUIRED_OPTIONS if o not in names] == []


def test_train_parses_into_run_config():
    args = build_parser().parse_args(["train", "qlora", "--model", "llama-1b", "--batch-size", "8", "--seq-len",
                                      "1024", "--max-steps", "20", "--gradient-checkpointing", "--no-double-quant",
                                      "--lora-targets", "q_proj,v_proj", "--lr", "1e-4"])
    cfg = config_from_args(args)
    assert cfg.method.method == "qlora" and cfg.model.model == "llama-1b"
    assert (cfg.data.batch_size, cfg.data.seq_len, cfg.train.max_steps) == (8, 1024, 20)
    assert cfg.model.gradient_checkpointing is True and cfg.method.double_quant is False
    assert cfg.method.lora_targets == ("q_proj", "v_proj") and cfg.train.lr == 1e-4


def test_untyped_options_keep_dataclass_defaults():
    cfg = config_from_args(build_parser().parse_args(["train", "full"]))
    assert cfg.data.seq_len == 128 and cfg.model.model == "tiny" and cfg.method.lora_r is None


@pytest.mark.parametrize("argv, fragment", [
    (["train", "dora"], "invalid choice: 'dora'"),
    (["train", "lora", "--batch-size", "two"], "invalid int value: 'two'"),
    (["train", "lora", "--quant-type", "nf3"], "invalid choice"),
])
def test_parse_errors_are_one_line(argv, fragment, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err


@pytest.mark.parametrize("argv, fragment", [
    (["train", "lora", "--gptq-bits", "4"], "--gptq-bits is a GPTQ option"),
    (["train", "full", "--model", "llama-9b"], "--model: 'llama-9b' is not a preset"),
    (["train", "full", "--model", "./no/such/dir"], "is not a directory"),
    (["train", "full", "--dataset", "missing.jsonl"], "does not exist"),
    (["train", "full", "--seq-len", "4096"], "--seq-len 4096 exceeds the 2048 positions"),
    (["train", "lora", "--lora-r", "100000"], "--lora-r 100000 exceeds the hidden size 64 of model 'tiny'"),
    (["train", "full", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["train", "full", "--device", "cpu", "--optimizer", "paged_adamw_8bit"], "needs a CUDA device"),
])
def test_user_errors_exit_2_with_one_line(argv, fragment, capsys, tmp_path):
    code = main(argv + ["--output-dir", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert fragment in err and "\n" not in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing was started


def test_help_runs_as_module():
    out = subprocess.run([sys.executable, "-m", "ftprof", "train", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert all(m in out.stdout for m in ("full", "lora", "qlora", "gptq-lora"))


@pytest.mark.parametrize("method, shown, hidden", [
    ("full", [], ["--lora-r", "--quant-type", "--gptq-bits", "--kbit-prepare"]),
    ("lora", ["--lora-r"], ["--quant-type", "--gptq-bits", "--kbit-prepare"]),
    ("qlora", ["--lora-r", "--quant-type", "--kbit-prepare"], ["--gptq-bits"]),
    ("gptq-lora", ["--lora-r", "--gptq-bits", "--kbit-prepare"], ["--quant-type"]),
])
def test_help_per_method_lists_only_what_it_accepts(method, shown, hidden, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", method, "--help-all"])
    text = capsys.readouterr().out
    assert all(s in text for s in shown) and not any(h in text for h in hidden)
    assert "measurement warm-up" in text and "--learning-rate" in text


@pytest.mark.parametrize("method, shown, hidden", [
    ("full", ["--active-steps"], ["--lora-r", "--quant-type", "--gptq-bits"]),
    ("qlora", ["--lora-r", "--quant-type"], ["--gptq-bits"]),
])
def test_profile_help_per_method_lists_only_what_it_accepts(method, shown, hidden, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["profile", method, "--help-all"])
    text = capsys.readouterr().out
    assert all(s in text for s in shown) and not any(h in text for h in hidden), text


def test_profile_method_rejects_another_methods_option(capsys, tmp_path):
    assert main(["profile", "lora", "--gptq-bits", "4", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--gptq-bits" in err and "lora" in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, method, active", [
    (["profile", "--active-steps", "2"], "qlora", 2),  # no method: qlora, options straight after `profile`
    (["profile", "lora", "--active-steps", "3"], "lora", 3),
    (["profile", "--active-steps", "2", "full", "--max-steps", "5"], "full", 2),
])
def test_profile_method_is_optional(argv, method, active):
    cfg = config_from_args(build_parser().parse_args(argv), extra_keys={"summarize", "baseline"})
    assert (cfg.method.method, cfg.profiling.prof_active_steps, cfg.profiling.profile) == (method, active, True)


def test_profile_summarize_parses_with_or_without_a_method():
    for argv in (["profile", "--summarize", "t.json", "--baseline", "a.json"],
                 ["profile", "lora", "--summarize", "t.json", "--baseline", "a.json"]):
        args = build_parser().parse_args(argv)
        assert (args.summarize, args.baseline) == ("t.json", "a.json")
    assert build_parser().parse_args(["profile", "full"]).summarize is None


def test_hf_spellings_are_aliases():
    args = build_parser().parse_args(["train", "lora", "--learning-rate", "1e-3", "--per-device-train-batch-size",
                                      "4", "--gradient-accumulation-steps", "2"])
    cfg = config_from_args(args)
    assert (cfg.train.lr, cfg.data.batch_size, cfg.train.grad_accum) == (1e-3, 4, 2)


@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
def test_readme_main_job_runs(tmp_path):
    """The README's main job, `ftprof train qlora`, as a user runs it (shortened)."""
    out = subprocess.run([sys.executable, "-m", "ftprof", "train", "qlora", "--max-steps", "4", "--output-dir",
                          str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ftprof qlora on tiny" in out.stdout and "tokens/s" in out.stdout
    (run,) = tmp_path.iterdir()
    assert {"config.json", "env.json", "steps.csv", "result.json"} <= {p.name for p in run.iterdir()}


def test_profile_quiet_prints_where_the_traces_are_but_not_how_to_open_them(tmp_path, capsys):
    from types import SimpleNamespace

    from ftprof.cli.profile import print_open_hints

    cycle = tmp_path / "profile" / "cycle1"
    cycle.mkdir(parents=True)
    (cycle / "trace_rank0_cycle1.pt.trace.json.gz").write_bytes(b"")
    result = SimpleNamespace(run_dir=str(tmp_path),
                             artifacts={"trace_rank0_cycle1": "profile/cycle1/trace_rank0_cycle1.pt.trace.json.gz"})
    print_open_hints(result, quiet=True)
    quiet = capsys.readouterr().out
    print_open_hints(result)
    loud = capsys.readouterr().out
    assert quiet.startswith("traces: ") and str(cycle) in quiet and "Perfetto" not in quiet
    assert "Perfetto" in loud


@pytest.mark.parametrize("gpu_trace, installed, shown, hidden", [
    (False, {"tensorboard", "torch_tb_profiler", "hta"}, ["TensorBoard"], ["HTA"]),  # HTA needs GPU kernels
    (True, {"tensorboard", "torch_tb_profiler", "hta"}, ["TensorBoard", "HTA"], []),
    (True, {"tensorboard"}, [], ["TensorBoard", "HTA"]),  # no profiler plugin, no HTA package
])
def test_open_hints_only_for_what_works_here(monkeypatch, gpu_trace, installed, shown, hidden):
    from ftprof.cli import profile
    from ftprof.profiling.layout import open_hints

    monkeypatch.setattr(profile, "_installed", lambda module: module in installed)
    text = "\n".join(profile.usable_hints(open_hints(Path("/r/profile/cycle1")), gpu_trace))
    assert text.startswith("traces: ") and "Perfetto" in text
    assert all(s in text for s in shown) and not any(h in text for h in hidden), text
