"""`ftprof plan` and methods whose package is not installed here (gptq-lora without gptqmodel): `all` leaves them out
when the rows are to run here (--verify, --train, a plan for this machine) and says so in one line; a method named
explicitly is refused in one line, exit 2, before the probe; a plan for --gpu NAME keeps their rows, noted. The
package check is ftprof.checks' own, with gptqmodel hidden from it (whether or not this venv has it)."""

import importlib.util
import json
from types import SimpleNamespace

import pytest
import yaml

from ftprof import checks
from ftprof.cli.main import main

NOTE = "gptq-lora left out: gptqmodel is not installed here (pip install 'ftprof[gptq]')"


@pytest.fixture
def no_gptqmodel(monkeypatch):
    """check_packages finds every package but gptqmodel (only ftprof.checks sees the difference)."""
    real = importlib.util.find_spec
    fake = SimpleNamespace(util=SimpleNamespace(find_spec=lambda name, *a: None if name == "gptqmodel"
                                                else real(name, *a)))
    monkeypatch.setattr(checks, "importlib", fake)


def plan(tmp_path, capsys, *argv):
    code = main(["plan", *argv, "--model", "tiny", "--seq-len", "64", "--plan-dir", str(tmp_path / "plan"),
                 "--output-dir", str(tmp_path / "runs")])
    out, err = capsys.readouterr()
    return code, out, err


def test_all_with_verify_leaves_out_what_cannot_run_here(tmp_path, capsys, monkeypatch, no_gptqmodel):
    from ftprof.bench import verify

    swept = []
    monkeypatch.setattr(verify, "run_top", lambda sweep, out: swept.append(yaml.safe_load(sweep.read_text())) or [])
    code, out, _ = plan(tmp_path, capsys, "all", "--device", "cpu", "--verify", "1000")  # every row that fits
    assert code == 1 and "no run finished with a prediction" in out  # (run_top ran nothing)
    assert NOTE in out.splitlines()
    data = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert data["methods"] == ["full", "lora", "qlora"] and data["notes"] == [NOTE]
    assert {r["method"] for r in data["rows"]} == {"full", "lora", "qlora"}
    methods = {e["method"] for e in swept[0]["experiments"]}
    assert "gptq-lora" not in methods and {"full", "lora", "qlora"} <= methods


def test_all_for_this_machine_leaves_it_out_too(tmp_path, capsys, no_gptqmodel):
    code, out, _ = plan(tmp_path, capsys, "all", "--device", "cpu")
    assert code == 0 and NOTE in out.splitlines()
    sweep = yaml.safe_load((tmp_path / "plan" / "plan-sweep.yaml").read_text())
    assert all(e["method"] != "gptq-lora" for e in sweep["experiments"])


@pytest.mark.parametrize("argv, why", [
    (["gptq-lora", "--device", "cpu", "--verify", "1"], "--verify runs the plan's rows here"),
    (["gptq-lora", "--device", "cpu", "--train"], "--train runs the plan's rows here"),
    (["gptq-lora", "--device", "cpu"], "the plan is for this machine"),
])
def test_a_method_named_explicitly_is_refused_before_the_probe(tmp_path, capsys, monkeypatch, no_gptqmodel, argv,
                                                               why):
    from ftprof.plan import make

    monkeypatch.setattr(make, "make_plan", lambda *a: pytest.fail("probed a method it cannot run"))
    code, out, err = plan(tmp_path, capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and not out, err
    assert "method 'gptq-lora' needs the 'gptqmodel' package: pip install 'ftprof[gptq]'" in err and why in err
    assert not (tmp_path / "plan").exists()


def test_a_plan_for_another_gpu_keeps_the_rows_with_a_note(tmp_path, capsys, no_gptqmodel):
    code, out, _ = plan(tmp_path, capsys, "all", "--gpu", "h100", "--show", "1000")
    assert code == 0
    note = ("gptq-lora: gptqmodel is not installed here; its rows are kept for --gpu h100 (install it where they "
            "run: pip install 'ftprof[gptq]')")
    assert note in out.splitlines() and "left out" not in out
    assert "needs gptqmodel here" in out  # the table's note on those rows
    data = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert data["methods"] == ["full", "lora", "qlora", "gptq-lora"] and data["notes"] == [note]
    needs = {(r["method"], r["needs_package"]) for r in data["rows"]}
    assert needs == {("full", ""), ("lora", ""), ("qlora", ""), ("gptq-lora", "gptqmodel")}
    header = (tmp_path / "plan" / "plan.csv").read_text().splitlines()[0]
    assert header.endswith(",needs_package")


def test_explicit_for_another_gpu_is_planned_too(tmp_path, capsys, no_gptqmodel):
    code, out, _ = plan(tmp_path, capsys, "gptq-lora", "--gpu", "h100", "--gptq-bits", "8")
    assert code == 0 and "#1: ftprof train gptq-lora" in out
    rows = json.loads((tmp_path / "plan" / "plan.json").read_text())["rows"]
    assert rows and all(r["needs_package"] == "gptqmodel" for r in rows)


def test_nothing_is_left_out_where_the_package_is_installed(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    fake = SimpleNamespace(util=SimpleNamespace(find_spec=lambda name, *a: object() if name == "gptqmodel"
                                                else real(name, *a)))
    monkeypatch.setattr(checks, "importlib", fake)
    code, out, _ = plan(tmp_path, capsys, "all", "--device", "cpu")
    data = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert code == 0 and "left out" not in out and data["notes"] == []
    assert "gptq-lora" in {r["method"] for r in data["rows"]}
