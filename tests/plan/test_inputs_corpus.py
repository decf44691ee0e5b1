"""Bad input to `ftprof plan`: the GPU, the budget, the GPU count, the calibration store and the cache directory
(issue 41). Each is one line, exit status 2, before torch is imported. A store with damaged lines is not bad input:
its lines are skipped with one warning (tests/plan/test_store.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cli.test_bad_input import RUNNER

BASE = ["plan", "lora", "--model", "tiny", "--device", "cpu"]
# (case, extra argv, environment changes, words the line must hold)
CASES = [
    ("unknown gpu", ["--gpu", "h300"], {}, ["--gpu: unknown GPU 'h300'", "did you mean h200"]),
    ("empty gpu", ["--gpu", ""], {}, ["--gpu"]),
    ("gpu a number", ["--gpu", "5"], {}, ["unknown GPU '5'"]),
    ("memory limit 0", ["--gpu", "h100", "--memory-limit-gib", "0"], {}, ["--memory-limit-gib"]),
    ("memory limit -1", ["--gpu", "h100", "--memory-limit-gib", "-1"], {}, ["--memory-limit-gib"]),
    ("memory limit nan", ["--gpu", "h100", "--memory-limit-gib", "nan"], {}, ["--memory-limit-gib"]),
    ("memory limit 1e9", ["--gpu", "h100", "--memory-limit-gib", "1e9"], {}, ["no GPU has that much memory"]),
    ("gpus 0", ["--gpus", "0"], {}, ["--gpus", "at least 1"]),
    ("gpus 2 on a CPU machine", ["--gpus", "2"], {}, ["--gpus 2", "no NVIDIA GPU", "--gpu NAME"]),
    ("store a directory", [], {"FTPROF_CALIBRATION": "{tmp}"}, ["FTPROF_CALIBRATION", "is a directory"]),
    ("store under a file", [], {"FTPROF_CALIBRATION": "{tmp}/file/calibration.jsonl"}, ["FTPROF_CALIBRATION"]),
    ("cache dir a file", [], {"FTPROF_CACHE_DIR": "{tmp}/file"}, ["FTPROF_CACHE_DIR"]),
    ("plan dir a file", ["--plan-dir", "{tmp}/file"], {}, ["--plan-dir"]),
    ("plan dir empty", ["--plan-dir", ""], {}, ["--plan-dir"]),
    ("model dir of a BERT", ["--model", "{tmp}/bert"], {}, ["not a decoder-only causal LM"]),
]


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_plan_input_corpus(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({
        "model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 256}))
    problems = []
    for case, extra, env, words in CASES:  # one process each: environments differ, and torch is checked per case
        base = BASE if "--model" not in extra else [a for a in BASE if a not in ("--model", "tiny")]
        if "--gpu" in extra:  # a plan for another machine: this one's --device is refused beside it
            base = [a for a in base if a not in ("--device", "cpu")]
        argv = [a.replace("{tmp}", str(tmp_path)) for a in [*base, *extra]]
        if "--plan-dir" not in extra:
            argv += ["--plan-dir", str(tmp_path / "plan")]
        environ = {**os.environ, **{k: v.replace("{tmp}", str(tmp_path)) for k, v in env.items()}}
        out = subprocess.run([sys.executable, "-c", RUNNER, json.dumps([argv])], capture_output=True, text=True,
                             timeout=120, env=environ)
        res = json.loads(out.stdout)[0]
        err = res["stderr"].strip()
        if res["code"] != 2 or len(err.splitlines()) != 1 or not all(w in err for w in words) or res["torch"]:
            problems.append(f"{case}: exit {res['code']}, torch {res['torch']}, stderr {err!r}")
    assert not problems, "\n".join(problems)
