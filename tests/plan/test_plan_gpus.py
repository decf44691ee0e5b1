"""`ftprof plan --gpus N`: the rows are those N processes can run (FSDP's refusals apply, --parallel ddp's do not),
and their commands and sweeps run on N GPUs, with today's option meanings (schema_version)."""

import pytest
import yaml

from ftprof.config import SCHEMA_VERSION, RunConfig
from ftprof.errors import ConfigError
from ftprof.plan import candidates


def _builds(cand, nproc: int, parallel: str) -> str | None:
    try:
        RunConfig.from_flat({**cand.flat(), "nproc_per_node": nproc, "parallel": parallel})
    except ConfigError as exc:
        return str(exc)
    return None


def test_every_candidate_of_a_sharded_target_is_a_valid_run():
    pool = candidates.for_target(["lora", "qlora"], 4, 4, 1, True, (9, 0), {}, shards=True, several=True)
    assert pool and not [why for c in pool if (why := _builds(c, 2, "fsdp"))]
    assert not any(c.option("fp8_base") for c in pool)  # e4m3 copies of whole weights: not under FSDP
    ddp = candidates.for_target(["qlora"], 4, 4, 1, True, (9, 0), {}, shards=False, several=True)
    assert any(c.option("fp8_base") for c in ddp) and not [why for c in ddp if (why := _builds(c, 2, "ddp"))]


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_a_plan_for_two_gpus_writes_commands_and_a_sweep_for_two(tmp_path, capsys):
    from ftprof.cli.main import main

    assert main(["plan", "all", "--model", "llama-1b", "--gpu", "h100", "--gpus", "2", "--plan-dir",
                 str(tmp_path)]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("#")]
    assert len(commands) == 3 and all("--nproc-per-node 2" in c for c in commands)
    sweep = yaml.safe_load((tmp_path / "plan-sweep.yaml").read_text())
    assert sweep["schema_version"] == SCHEMA_VERSION and sweep["base"]["nproc_per_node"] == 2


def test_a_cpu_plans_budget_is_not_passed_to_the_runs_it_suggests(tmp_path, capsys):
    """On a CPU --memory-limit-gib is the plan's budget only: ``ftprof train`` refuses it there (it caps a GPU's
    allocator), so the commands, the sweep and --train's trials leave it out."""
    from ftprof.cli.main import main

    assert main(["plan", "lora", "--model", "tiny", "--device", "cpu", "--memory-limit-gib", "24", "--plan-dir",
                 str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "budget" in out and "--memory-limit-gib" not in "\n".join(x for x in out.splitlines() if x.startswith("#"))
    assert "memory_limit_gib" not in yaml.safe_load((tmp_path / "plan-sweep.yaml").read_text())["base"]


def test_a_budget_larger_than_the_card_is_the_cards(tmp_path, capsys):
    from ftprof.cli.main import main

    assert main(["plan", "lora", "--model", "tiny", "--gpu", "l4", "--memory-limit-gib", "48", "--plan-dir",
                 str(tmp_path)]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "--memory-limit-gib 48 is more than that" in header and "budget 19.8 GiB" in header
    import csv

    with open(tmp_path / "plan.csv") as fh:  # the band and the peak's parts, as plan.json has them
        first = next(csv.DictReader(fh))
    assert float(first["tokens_per_s_error"]) > 0 and first["confidence"] in ("high", "medium", "low")
    assert all(float(first[k]) > 0 for k in ("static_gib", "activation_gib")) and "tie" in first


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_rows_without_a_speed_say_why_and_where_they_rank(tmp_path, capsys):
    """A calibrated GPU's rows of an uncalibrated kind said "no calibration for <the GPU>"; they now name the kind,
    and a line says how many fit unpriced and where they rank."""
    import csv

    from ftprof.cli.main import main

    assert main(["plan", "all", "--model", "tiny", "--gpu", "h100", "--plan-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    with open(tmp_path / "plan.csv") as fh:
        unpriced = [r for r in csv.DictReader(fh) if r["fits"] == "True" and not r["tokens_per_s"]]
    assert unpriced and all(r["speed_source"].startswith("no run of this kind (") for r in unpriced)
    assert f"{len(unpriced)} configuration(s) that fit have no speed prediction" in out
