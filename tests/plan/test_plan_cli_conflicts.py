"""`ftprof plan` options that conflict with the plan asked for, or that the plan chooses among: a conflict is one
line and exit status 2 before torch loads (so before any probe, and before the plan's files); an option the plan
chooses among (checkpointing, kernels, compile, the declared candidate options), given, is the only value its rows
take, and the header says so."""

import json

import pytest

from ftprof.cli.main import main
from ftprof.errors import ConfigError
from tests.cli.test_bad_input import run_in_one_interpreter

REFUSED = [
    # --verify and --train run here, --device picks this machine's device: any --gpu plans for another machine
    (["lora", "--gpu", "h100", "--verify", "3"], "--verify runs the plan's top rows on this machine, but --gpu h100 "
     "plans for another"),
    (["lora", "--gpu", "h100", "--train"], "--train trains on this machine, but --gpu h100 plans for another"),
    (["lora", "--gpu", "h100", "--device", "cpu"], "--device picks the device on this machine"),
    # options the plan would ignore
    (["lora", "--trial-steps", "3"], "--trial-steps times --train's trials: give --train too"),
    (["lora", "--gpu", "h100", "--run-name", "mine"], "--run-name names --train's run: give --train too"),
    (["lora", "--quiet"], "--quiet quiets --train's run: give --train too"),
    # a budget the margin eats whole
    (["all", "--gpu", "l4", "--model", "llama-70b", "--memory-limit-gib", "0.5"],
     "--memory-limit-gib 0.5 leaves no budget: the plan keeps a margin of it free (8% of the budget, at least 1 GiB), "
     "so give more than 1 GiB"),
    (["lora", "--gpu", "h100", "--memory-limit-gib", "1"], "--memory-limit-gib 1 leaves no budget"),
    # weights alone over the budget, at the fewest bits any planned method stores them in
    (["full", "--gpu", "l4", "--model", "llama-70b"], "nothing can fit: 'llama-70b' has at least 48.6B parameters, "
     "90.5 GiB per GPU in 16 bits (full) before any activation, over the 19.8 GiB budget"),
    (["all", "--gpu", "l4", "--model", "llama-70b"], "22.6 GiB per GPU in 4 bits (qlora)"),
    # a pinned value no candidate of the target has
    (["lora", "--device", "cpu", "--kernels", "liger"], "--kernels liger: ftprof plan tries no configuration of lora "
     "on cpu with that (on a CPU it tries eager kernels"),
    (["lora", "--gpu", "a100-80gb", "--fp8-base"], "(--fp8-base needs compute capability 8.9; the target has 8.0)"),
    (["lora", "--gpu", "h100", "--checkpointing", "full", "--compile", "--compile-mode", "reduce-overhead"],
     "--checkpointing full --compile --compile-mode reduce-overhead: ftprof plan tries no configuration of lora on "
     "NVIDIA H100 80GB HBM3 with those together"),
    (["lora", "--gpu", "h100", "--checkpointing", "selective", "--checkpoint-layers", "1"],
     "the plan checkpoints part of the layers under full checkpointing only"),
]


def test_conflicts_are_one_line_exit_2_before_torch(tmp_path):
    argvs = [["plan", *argv, "--model", "tiny", "--plan-dir", str(tmp_path / f"plan{i}")] if "--model" not in argv
             else ["plan", *argv, "--plan-dir", str(tmp_path / f"plan{i}")] for i, (argv, _) in enumerate(REFUSED)]
    for (argv, fragment), result in zip(REFUSED, run_in_one_interpreter(argvs), strict=True):
        err = result["stderr"]
        assert result["code"] == 2 and fragment in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert not result["torch"], (argv, "torch was imported before the refusal")
    assert list(tmp_path.iterdir()) == []  # no plan's files


def plan(tmp_path, capsys, *argv):
    code = main(["plan", *argv, "--model", "tiny", "--plan-dir", str(tmp_path / "plan"),
                 "--output-dir", str(tmp_path / "runs")])
    out, err = capsys.readouterr()
    return code, " ".join(out.split()), json.loads((tmp_path / "plan" / "plan.json").read_text())["rows"]


def test_options_the_plan_chooses_among_given_pin_its_rows(tmp_path, capsys):
    code, out, rows = plan(tmp_path, capsys, "lora", "--gpu", "h100", "--checkpointing", "full", "--kernels", "eager",
                           "--no-compile")
    assert code == 0 and "margin); only --checkpointing full --no-compile --kernels eager, as given" in out
    assert rows and {(r["checkpointing"], r["kernels"], r["compile"]) for r in rows} == {("full", "eager", False)}
    assert {r["checkpoint_layers"] for r in rows} > {None}  # full on part of the layers is still compared
    assert len({r["options"] for r in rows}) > 1  # and the options not given
    assert "#1: ftprof train lora --model tiny --checkpointing full" in out


def test_a_pinned_layer_count_and_the_hf_spelling_of_checkpointing(tmp_path, capsys):
    code, out, rows = plan(tmp_path, capsys, "lora", "--gpu", "h100", "--gradient-checkpointing",
                           "--checkpoint-layers", "1", "--fp8-base")
    assert code == 0 and "only --checkpoint-layers 1 --checkpointing full --fp8-base, as given" in out
    assert {(r["checkpointing"], r["checkpoint_layers"]) for r in rows} == {("full", 1)}
    assert all("fp8" in r["options"].split() for r in rows)
    # the row's own policy is in its command, not --gradient-checkpointing beside it
    assert "--gradient-checkpointing" not in out and "--checkpointing full --checkpoint-layers 1" in out


def test_auto_pins_no_policy(tmp_path, capsys):
    code, out, rows = plan(tmp_path, capsys, "lora", "--device", "cpu", "--checkpointing", "auto")
    assert code == 0 and "as given" not in out
    assert {r["checkpointing"] for r in rows} == {"none", "selective", "full"}


def _request(**flat):
    from ftprof.config import RunConfig
    from ftprof.plan.make import PlanRequest

    pins = flat.pop("pins", ())
    gpu = flat.pop("gpu", None)
    cfg = RunConfig.from_flat({"method": "lora", "model": "tiny", **flat})
    return PlanRequest(cfg, ("lora",), gpu, pins=pins)


def test_pins_no_candidate_of_this_machine_has_are_refused_once_the_target_is_known():
    """What the CLI cannot tell without torch (this machine's GPU, tied embeddings), make_plan refuses."""
    from ftprof.plan.make import make_plan

    with pytest.raises(ConfigError, match=r"^--kernels liger: ftprof plan tries no configuration of lora on cpu"):
        make_plan(_request(device="cpu", pins=(("kernels", "liger"),)))


def test_a_budget_the_margin_eats_is_not_called_0_gib():
    from ftprof.cli.plan import nothing_fits
    from ftprof.plan.make import make_plan

    plan = make_plan(_request(gpu="h100", memory_limit_gib=0.5))  # the CLI refuses it; a free 0.5 GiB is possible
    assert not plan.fitting and plan.budget_bytes < 0
    line = nothing_fits(plan)
    assert "no configuration of lora fits: --memory-limit-gib 0.5 (0.50 GiB) leaves nothing after the 1.00 GiB " \
        "margin" in line and "fits 0" not in line


@pytest.mark.slow  # a trial and a short run, each its own training: ~20 s on the 2-core machine
def test_train_s_own_run_takes_the_name_given(tmp_path, capsys):
    """--run-name and --quiet act on --train's full run (the trials' sweep may not set them: bench names its runs)."""
    code = main(["plan", "lora", "--model", "tiny", "--device", "cpu", "--seq-len", "32", "--train", "--verify", "1",
                 "--trial-steps", "2", "--max-steps", "2", "--run-name", "mine", "--quiet",
                 "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert json.loads((tmp_path / "mine" / "result.json").read_text())["selection"]["choice"] in out


def test_a_plan_dir_holding_another_models_verified_rows_is_refused_before_planning(tmp_path, capsys):
    """Bench would refuse it too (a folder holds one sweep's results), but only after the plan and its probe."""
    verify = tmp_path / "plan" / "verify"
    verify.mkdir(parents=True)
    (verify / "sweep.json").write_text(json.dumps({"name": "plan-llama-8b", "experiments": []}))
    code = main(["plan", "lora", "--model", "tiny", "--device", "cpu", "--verify", "1", "--plan-dir",
                 str(tmp_path / "plan")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "holds the verified rows of sweep 'plan-llama-8b', and this plan's is 'plan-tiny'" in err[0]
    assert sorted(p.name for p in (tmp_path / "plan").iterdir()) == ["verify"]  # no plan files written
