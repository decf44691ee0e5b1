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
    assert code == 0 and "ftprof plan: tiny, seq 128, 2 sequences (256 tokens) per optimizer step per GPU, on cpu" \
        in out.replace("\n", " ")
    assert "#1: ftprof train " in out  # the top rows' commands
    data = json.loads((tmp_path / "plan" / "plan.json").read_text())
    fitting = sum(r["fits"] for r in data["rows"])
    assert (f"({fitting - 15} not shown above: --show N, or plan.csv)" in out.replace("\n", " ")) == (fitting > 15)
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
    code, out, _ = plan(tmp_path, capsys, "lora", "--model", "tiny", "--device", "cpu", "--max-steps", "5",
                        "--verify", "2")  # 5 steps: 3 steady, the least a record is made of (plan/records.py)
    assert code == 0, out
    rows = json.loads((tmp_path / "plan" / "plan.json").read_text())["rows"][:2]
    run_dirs = sorted((tmp_path / "plan" / "verify").glob("*/result.json"))
    assert len(run_dirs) == 2
    recorded = sorted(json.loads(p.read_text())["prediction"]["peak_bytes"] for p in run_dirs)
    assert recorded == sorted(r["prediction"]["peak_bytes"] for r in rows)  # one predictor, the same figure
    assert "memory error %" in out and "memory parts (CPU)" in out  # --verify prints tables
    # the runs fed the calibration store (the session's, shared with other tests: these runs' own records)
    ours = [r for r in calibration.load_records() if str(tmp_path) in r["run_dir"]]
    assert len(ours) == 2 and all(r["device_name"] == "cpu" and r["method"] == "lora" for r in ours)
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
    (["qlora", "--model", "tiny", "--gpu", "h100", "--memory-limit-gib", "1.0005"], "no configuration of qlora fits"),
    (["qlora", "--top", "0"], "must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, fragment):
    try:
        code, _, err = plan(tmp_path, capsys, *argv)
    except SystemExit as exc:  # argparse's own
        code, err = exc.code, capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "plan").exists()


def test_plans_of_other_shapes_or_methods_do_not_overwrite_each_other(tmp_path, capsys):
    from ftprof.cli.main import main

    for methods, seq in (("lora", "64"), ("lora", "128"), ("full,lora", "128")):
        assert main(["plan", methods, "--model", "tiny", "--device", "cpu", "--seq-len", seq,
                     "--output-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan-tiny-full+lora-s128-2x1-here",
                                                          "plan-tiny-lora-s128-2x1-here", "plan-tiny-lora-s64-2x1-here"]


def test_a_row_s_command_runs_that_row(tmp_path, capsys):
    """The command printed for a row parses back into the row's configuration."""
    from ftprof.cli.common import config_from_args
    from ftprof.cli.main import build_parser
    from ftprof.plan.candidates import of_config

    code, out, _ = plan(tmp_path, capsys, "lora", "--model", "tiny", "--device", "cpu")
    data = json.loads((tmp_path / "plan" / "plan.json").read_text())
    line = next(x for x in out.splitlines() if x.startswith("#1: "))
    args = build_parser().parse_args(line.removeprefix("#1: ftprof ").split())
    cand = of_config(config_from_args(args))
    top = data["rows"][0]
    assert (cand.method, cand.checkpointing, cand.batch_size, cand.grad_accum) == \
        (top["method"], top["checkpointing"], top["batch_size"], top["grad_accum"])


def test_verify_tables_are_tables_not_frame_dumps():
    import pandas as pd
    from rich.console import Console

    from ftprof.cli.plan import cell, frame_table

    frame = pd.DataFrame([{"run": "qlora b4", "tokens_per_s_error_pct": 0.372324, "memory_under_predicted": None,
                           "measured_tokens_per_s": 13843.2}])
    console = Console(record=True, width=200)
    console.print(frame_table(frame, "predicted against measured"))
    text = console.export_text()
    assert "0.372324" not in text and "None" not in text and "+0.4" in text and "13,843" in text
    assert cell("x_pct", -12.34) == "-12.3" and cell("runs", 3) == "3" and cell("x", float("nan")) == "-"


def test_verify_view_keeps_rank_and_errors_and_leaves_sources_to_the_csv(tmp_path):
    import pandas as pd

    from ftprof.cli.plan import verify_view
    from ftprof.plan.accuracy import COMPARISON_COLUMNS

    row = dict.fromkeys(COMPARISON_COLUMNS) | {"run": "qlora b1", "run_name": "second", "memory_error_pct": 2.4,
                                               "speed_source": "shipped defaults (a long source)"}
    flat = [{"run_name": "second", "step_time_p50_s": 0.5, "step_time_p90_s": 0.64, "nvml_gpu0_util_mean": 69.57}]
    view = verify_view(pd.DataFrame([row], columns=COMPARISON_COLUMNS), [tmp_path / "first", tmp_path / "second"],
                       flat)
    assert view.iloc[0]["#"] == 2 and view.iloc[0]["memory error_pct"] == 2.4
    assert view.iloc[0]["p90/p50"] == 1.28  # how steady the measured steps were
    assert view.iloc[0]["GPU busy %"] == 70  # and whether the GPU waited on the host
    assert "speed_source" not in view and "run_name" not in view and "device_name" not in view


def test_verify_names_the_rows_whose_measurement_is_partly_the_machines(tmp_path):
    """Unsteady steps, and a GPU waiting on the host: the rows whose error is partly this machine's (a mistral-7b
    cell ran 13,620 tokens/s at 70% busy in one call, 16,653 in the next, H200)."""
    import pandas as pd

    from ftprof.cli.plan import _measurement_notes, verify_view
    from ftprof.plan.accuracy import COMPARISON_COLUMNS

    names = ["steady", "unsteady", "waiting", "no-nvml"]
    table = pd.DataFrame([dict.fromkeys(COMPARISON_COLUMNS) | {"run": n, "run_name": n} for n in names],
                         columns=COMPARISON_COLUMNS)
    flat = [{"run_name": "steady", "step_time_p50_s": 0.5, "step_time_p90_s": 0.51, "nvml_gpu0_util_mean": 98.0},
            {"run_name": "unsteady", "step_time_p50_s": 0.5, "step_time_p90_s": 0.6, "nvml_gpu0_util_mean": 97.0},
            {"run_name": "waiting", "step_time_p50_s": 0.5, "step_time_p90_s": 0.51, "nvml_gpu0_util_mean": 70.0},
            {"run_name": "no-nvml", "step_time_p50_s": 0.5, "step_time_p90_s": 0.5, "nvml_gpu0_util_mean": None}]
    notes = _measurement_notes(verify_view(table, [tmp_path / n for n in names], flat))
    assert len(notes) == 2
    assert notes[0].startswith("unsteady (p90/p50 above 1.05): rank 2:")
    assert notes[1].startswith("host-bound (GPU busy below 85%): rank 3:")
