"""Bad-input corpus: every case exits 2 with exactly one line on stderr, no traceback, and (except where the check
needs a tokenizer or data pipeline) without importing torch. All cases run in one fresh interpreter, in-process
through ``ftprof.cli.main.main``, so the corpus stays fast and ``sys.modules`` tells what each case imported."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

RUNNER = textwrap.dedent("""
    import contextlib, io, json, sys, time
    from ftprof.cli.main import main
    out = []
    for argv in json.loads(sys.argv[1]):
        err = io.StringIO()
        start = time.monotonic()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
            except BaseException as exc:  # a traceback the user would see
                import traceback
                traceback.print_exc(file=err)
                code = "raised"
        out.append({"argv": argv, "code": code, "stderr": err.getvalue(), "torch": "torch" in sys.modules,
                    "seconds": time.monotonic() - start})
    print(json.dumps(out))
""")


def run_in_one_interpreter(argvs: list[list[str]], cwd=None, timeout: float = 300, env=None) -> list[dict]:
    """``ftprof.cli.main.main`` on each argv in turn, in one fresh interpreter (RUNNER; ``env``: variables added to
    this process's): each case's exit code, stderr, whether torch was imported by then, and its seconds."""
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(argvs)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def corpus_problems(cases: list[tuple], cwd) -> list[str]:
    """Run ``cases`` — (argv, words the line must hold, words it must not hold, torch allowed) — in one
    interpreter; one line for each case that is not exit 2 with one such line on stderr."""
    results = run_in_one_interpreter([argv for argv, *_ in cases], cwd)
    problems = []
    for (argv, want, unwanted, torch_ok), res in zip(cases, results, strict=True):
        err = res["stderr"]
        lines = err.strip().splitlines()
        if (res["code"] != 2 or len(lines) != 1 or any(w not in err for w in want)
                or any(w in err for w in unwanted) or (res["torch"] and not torch_ok)):
            problems.append(f"{' '.join(argv[-3:])}: exit {res['code']}, torch {res['torch']}, stderr {err!r}")
    return problems

FAST = "base: {model: tiny, seq_len: 32, max_steps: 3, device: cpu}\n"


def _files(tmp):
    """Bad files the cases point to."""
    (tmp / "a_file").write_text("x")
    (tmp / "empty.json").write_text("{}")
    (tmp / "list.json").write_text("[]")
    (tmp / "dir").mkdir()
    sweeps = {
        "dup.yaml": FAST + "matrix: {method: [full]}\nmatrix: {method: [lora]}\n",
        "dup_inner.yaml": "base: {model: tiny, seq_len: 32, seq_len: 64}\nmatrix: {method: [full]}\n",
        "nan_timeout.yaml": FAST + "matrix: {method: [full]}\ntimeout_s: .nan\n",
        "inf_lr.yaml": FAST + "matrix: {method: [full], lr: [0.1, .inf]}\n",
        "long_seq.yaml": FAST + "matrix: {method: [full], seq_len: [64, 4096]}\n",
        "no_data.yaml": FAST + "matrix: {method: [full]}\nexperiments: [{dataset: missing.jsonl}]\n",
        "bad_target.yaml": FAST + "matrix: {method: [lora], lora_targets: [[q_proj], [qkv_proj]]}\n",
        "unknown_key.yaml": FAST + "matrix: {method: [full]}\ntimout_s: 5\n",
        "neg_wd.yaml": FAST + "matrix: {method: [full], weight_decay: [-0.1]}\n",
        "list_top.yaml": "- method: full\n",
        "bad_yaml.yaml": "base: {model: tiny\n",
        "prof_rank.yaml": "base: {model: tiny, profile: true}\nmatrix: {method: [full], prof_ranks: ['2']}\n",
        "good.yaml": FAST + "matrix: {method: [full]}\n",
        # what train refuses at once must not be launched to fail: bad data content, GPU options on a CPU run
        "empty_data.yaml": FAST + "matrix: {method: [full]}\nexperiments: [{dataset: empty.jsonl}]\n",
        "liger_cpu.yaml": FAST + "matrix: {method: [lora], kernels: [eager, liger]}\n",
    }
    for name, text in sweeps.items():
        (tmp / name).write_text(text)
    (tmp / "empty.jsonl").write_text("")
    (tmp / "run_bad_key.yaml").write_text("method: lora\nmax_step: 3\n")
    late = tmp / "late.jsonl"
    late.write_text('{"text": "a b c"}\n{"text": "d e f"}\n{"text": \n')


def _cases(t):
    train = ["train", "lora", "--output-dir", str(t / "runs")]
    bench = ["bench", "--output-dir", str(t / "bench_out")]
    light = [
        # numbers: ranges, NaN and inf
        (train + ["--lr", "inf"], "--lr"), (train + ["--lr", "nan"], "--lr"), (train + ["--lr", "-1"], "--lr"),
        (train + ["--weight-decay", "-1"], "--weight-decay"), (train + ["--lora-dropout", "nan"], "--lora-dropout"),
        (train + ["--max-grad-norm", "inf"], "--max-grad-norm"), (train + ["--batch-size", "0"], "--batch-size"),
        (train + ["--max-steps", "0"], "--max-steps"), (train + ["--seq-len", "1"], "--seq-len"),
        # a run people keep: schedules, epochs, eval, --config
        (train + ["--warmup-steps", "2", "--warmup-ratio", "0.1"], "--warmup-ratio"),
        (train + ["--lr-scheduler-type", "cosin"], "cosine"), (train + ["--num-train-epochs", "2"], "synthetic"),
        (train + ["--eval-dataset", str(t / "missing.jsonl"), "--dataset", str(t / "late.jsonl")], "missing.jsonl"),
        (train + ["--bf16", "--dtype", "float32"], "--dtype"),
        (["train", "--config", str(t / "run_bad_key.yaml")], "did you mean 'max_steps'"),
        (["train", "--config", str(t / "missing.yaml")], "missing.yaml"), (["train"], "give a method"),
        (["profile", "--prof-max-trace-mb", "nan", "--output-dir", str(t / "runs")], "--prof-max-trace-mb"),
        # the model and its modules
        (train + ["--lora-targets", "qkv_proj"], "qkv_proj"), (train + ["--seq-len", "4096"], "2048 positions"),
        (train + ["--model", "llama-9b"], "llama-9b"), (train + ["--model", "./no/such/dir"], "no/such/dir"),
        (["train", "full", "--lora-r", "8"], "--lora-r"),
        (train + ["--sdpa-backend", "flashy"], "flashy"),
        # profiler options against the host and the world size
        (train + ["--prof-activities", "cuda"], "cuda"), (train + ["--prof-activities", "tpu"], "tpu"),
        (train + ["--prof-ranks", "3"], "--prof-ranks"), (train + ["--prof-ranks", "x"], "--prof-ranks"),
        (train + ["--prof-ranks", "0,00"], "rank 0 is named more than once"),
        # output paths
        (["train", "lora", "--output-dir", str(t / "a_file")], "a_file"),
        (["train", "lora", "--output-dir", str(t / "a_file" / "sub")], "a_file"),
        (train + ["--prof-output-dir", str(t / "a_file")], "a_file"),
        (bench[:1] + [str(t / "good.yaml"), "--output-dir", str(t / "a_file")], "a_file"),
        # paths a file system refuses, whatever the permission bits say; empty paths
        (train[:2] + ["--output-dir", str(t / ("a" * 300))], "cannot create it (File name too long)"),
        (train + ["--run-name", "b" * 300], "--run-name"),
        (["profile", "--summarize", ""], "--summarize: an empty path"),
        (["report", str(t), "--baseline", ""], "--baseline: an empty path"),
        # options that need a GPU, on a run that cannot have one: before torch
        (train + ["--device", "cpu", "--fsdp-cpu-offload"], "needs a CUDA device"),
        (train + ["--device", "cpu", "--kernels", "liger"], "--kernels liger needs a CUDA device"),
        (train + ["--device", "cpu", "--memory-limit-gib", "4"], "--memory-limit-gib caps GPU memory"),
        (train + ["--device", "cpu", "--compile", "--compile-mode", "reduce-overhead"], "CUDA graphs"),
        (["train", "qlora", "--device", "cpu", "--dequant-kernel", "triton"], "--dequant-kernel triton"),
        (train + ["--parallel", "ddp", "--fsdp-cpu-offload"], "applies to --parallel fsdp only"),
        # the rendezvous, checked before torchrun starts
        (train + ["--nproc-per-node", "2", "--rdzv-endpoint", "localhost:abc"], "--rdzv-endpoint"),
        (train + ["--nnodes", "2", "--rdzv-endpoint", "notaport"], "must be host:port"),
        (train + ["--nproc-per-node", "2", "--rdzv-backend", "bogus"], "bogus"),
        # abbreviations stand for nothing (they slipped past the repeat check); unknown options get a suggestion
        (train + ["--max-steps", "3", "--max-step", "4"], "did you mean '--max-steps'"),
        (train + ["--lora-rr", "8"], "did you mean '--lora-r'"),
        # "the fastest for my GPU": where that is, not the nearest spelling (--fast was offered --format)
        (["plan", "qlora", "--fast"], "top row is the fastest"), (train + ["--auto"], "--train` tries every option"),
        # repeated options, unknown options
        (["profile", "--active-steps", "2", "--prof-active-steps", "3"], "repeats"),
        (train + ["--packing", "--no-packing"], "repeats"), (train + ["--lr", "1e-3", "--lr=2e-3"], "repeats"),
        (train + ["--learning-rte", "1"], "learning-rte"), (["train", "sft"], "sft"),
        (train + ["--lr", "1e-3", "--learning-rate", "2e-3"], "repeats"),  # an HF alias is the same option
        (train + ["--dataset", str(t / "missing.jsonl")], "does not exist"),
        (train + ["--dataset", str(t / "data.xlsx")], "data.xlsx"),
        (train + ["--dataset", str(t / "late.jsonl")], "line 3 is not JSON"),
        (train + ["--dataset", str(t / "dir")], "save_to_disk"),
        # summarize and report
        (["profile", "--summarize", str(t / "empty.json")], "no trace events"),
        (["profile", "--summarize", str(t / "list.json")], "no trace events"),
        (["profile", "--summarize", str(t / "dir")], "holds no"),  # a folder: its traces, and it has none
        (["profile", "--summarize", str(t / "nope.json")], "does not exist"),
        (["report", str(t), "--threshold", "nan"], "--threshold"),
        (["report", str(t), "--threshold", "-inf"], "--threshold"),
        # sweep files
        *[(bench[:1] + [str(t / name)] + bench[1:], why) for name, why in (
            ("dup.yaml", "given twice"), ("dup_inner.yaml", "given twice"), ("nan_timeout.yaml", "timeout_s"),
            ("inf_lr.yaml", "finite"), ("long_seq.yaml", "2048 positions"), ("no_data.yaml", "missing.jsonl"),
            ("bad_target.yaml", "qkv_proj"), ("unknown_key.yaml", "timeout_s"), ("neg_wd.yaml", "--weight-decay"),
            ("list_top.yaml", "mapping"), ("bad_yaml.yaml", "YAML"), ("prof_rank.yaml", "--prof-ranks"),
            ("missing.yaml", "does not exist"), ("empty_data.yaml", "empty.jsonl"),
            ("liger_cpu.yaml", "--kernels liger needs a CUDA device"))],
        (bench[:1] + [str(t / "good.yaml"), "--force", "--resume"], "--resume"),
    ]
    heavy = []  # cases whose check needs torch (none today: keep the split for those that will)
    return light, heavy


def test_bad_input_corpus(tmp_path):
    _files(tmp_path)
    light, heavy = _cases(tmp_path)
    results = run_in_one_interpreter([argv for argv, _ in light + heavy], tmp_path)
    problems = []
    for (argv, why), res in zip(light + heavy, results, strict=True):
        lines = res["stderr"].strip().splitlines()
        if res["code"] != 2 or len(lines) != 1 or "Traceback" in res["stderr"] or why not in res["stderr"]:
            problems.append(f"{' '.join(argv[:1] + argv[1:][-4:])}: exit {res['code']}, stderr {res['stderr']!r}")
    assert problems == [], "\n".join(problems)
    light_results = results[:len(light)]
    imported = [r["argv"] for r in light_results if r["torch"]]
    assert imported == [], f"torch imported by {imported[0]}"


@pytest.mark.parametrize("argv", [["train", "lora", "--lr", "inf"], ["bench", "dup.yaml"]])
def test_bad_input_as_a_command(tmp_path, argv):
    """The same, end to end as a process (exit status and stderr as a shell sees them)."""
    _files(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "ftprof", *argv], capture_output=True, text=True, cwd=tmp_path,
                          timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
