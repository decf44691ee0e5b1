"""`ftprof plan` on the tiny preset on CPU: the ranked plan and its files, --verify against real runs (each run's own
recorded prediction is the plan's), the calibration store feeding the next plan, --gpu for a card this machine
does not have, and bad input as one line with exit status 2."""

import json

import pytest
import yaml

from ftprof.bench.sweep import load_sweep
from ftprof.cli.main import main
from ftprof.plan import calibration


def plan(tmp_path, capsys, *argv):
    code = main(["plan", *argv, "--plan-dir", str(tmp_path / "plan"), "--output-dir", str(tmp_path / "runs")])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_plan_ranks_what_fits_and_writes_its_files(tmp_path, capsys):
    code, out, _ = plan(tmp_path, capsys, "full,lora", "--model", "tiny", "--device", "cpu", "--top", "3")
    assert code == 0 and "ftprof plan: tiny on cpu" in out
    data = json.loads((tmp_path / "plan" / "plan.json").read_text())
    rows = data["rows"]
    assert {r["method"] for r in rows} == {"full", "lora"} and data["target"] == "cpu"
    assert {r["checkpointing"] for r in rows} == {"none", "selective", "full"}
    assert {(r["batch_size"], r["grad_accum"]) for r in rows} == {(2, 1), (1, 2)}  # same sequences per step
    fits = [r["fits"] for r in rows]
    assert fits == sorted(fits, reverse=True)  # everything that fits comes first
    assert all(r["prediction"]["peak_bytes"] > r["prediction"]["activation_bytes"] > 0 for r in rows)
    # full fine-tuning holds AdamW state for every weight: more static memory than LoRA's, policy for policy
    static = {(r["method"], r["checkpointing"], r["batch_size"]): r["prediction"]["static_bytes"] for r in rows}
    assert static[("full", "none", 2)] > 2 * static[("lora", "none", 2)]
    sweep = load_sweep(tmp_path / "plan" / "plan-sweep.yaml")
    assert len(sweep.experiments) == 3
    first = yaml.safe_load((tmp_path / "plan" / "plan-sweep.yaml").read_text())["experiments"][0]
    assert first["method"] == rows[0]["method"] and first["checkpointing"] == rows[0]["checkpointing"]
    assert (tmp_path / "plan" / "plan.csv").read_text().splitlines()[0].startswith("rank,method,checkpointing")


@pytest.mark.slow  # two training processes through bench: 25 s on the 2-core machine
def test_verify_runs_the_top_and_each_run_recorded_the_plans_prediction(tmp_path, capsys):
    code, out, _ = plan(tmp_path, capsys, "lora", "--model", "tiny", "--device", "cpu", "--max-steps", "4",
                        "--verify", "2")
    assert code == 0, out
    rows = json.loads((tmp_path / "plan" / "plan.json").read_text())["rows"][:2]
    run_dirs = sorted((tmp_path / "plan" / "verify").glob("*/result.json"))
    assert len(run_dirs) == 2
    recorded = sorted(json.loads(p.read_text())["prediction"]["peak_bytes"] for p in run_dirs)
    assert recorded == sorted(r["prediction"]["peak_bytes"] for r in rows)  # one predictor, the same figure
    assert "memory_error_pct" in out and "memory parts (CPU)" in out
    # the runs fed the calibration store: the next plan predicts CPU tokens/s from them
    assert any(r["device_name"] == "cpu" and r["method"] == "lora" for r in calibration.load_records())
    code, out, _ = plan(tmp_path, capsys, "lora", "--model", "tiny", "--device", "cpu")
    top = json.loads((tmp_path / "plan" / "plan.json").read_text())["rows"][0]
    assert top["tokens_per_s"] > 0 and top["speed_source"].startswith("local store")


def test_a_gpu_this_machine_lacks_is_planned_from_the_shipped_calibration(tmp_path, capsys):
    code, out, _ = plan(tmp_path, capsys, "qlora", "--model", "tiny", "--gpu", "a100-80gb", "--seq-len", "64")
    assert code == 0
    data = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert data["target"] == "NVIDIA A100-SXM4-80GB"
    assert {r["kernels"] for r in data["rows"]} == {"eager", "liger"} and {r["compile"] for r in data["rows"]} == {
        True, False}  # GPU options are candidates on a GPU target, from a CPU machine
    speeds = [r for r in data["rows"] if r["tokens_per_s"]]
    assert speeds and all("scaled by peak bf16 FLOP/s" in r["speed_source"] for r in speeds)


@pytest.mark.parametrize("argv, fragment", [
    (["qlora", "--gpu", "h2000"], "unknown GPU 'h2000' (did you mean h200?)"),
    (["qlora,dora"], "unknown method 'dora'"),
    (["qlora", "--model", "tiny", "--gpu", "h100", "--memory-limit-gib", "0.5"], "no configuration of qlora fits"),
    (["qlora", "--top", "0"], "must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, fragment):
    try:
        code, _, err = plan(tmp_path, capsys, *argv)
    except SystemExit as exc:  # argparse's own
        code, err = exc.code, capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "plan").exists()
