"""tests/requires.py: a test that needs an optional package skips, naming the package and how to install it, where
the package is missing, and runs where it is installed; a parametrized test skips only the parameters that need
it. Checked by running pytest on a small test file in a subprocess (the marks as pytest applies them)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

from tests import requires as req

ROOT = Path(__file__).resolve().parent.parent
ABSENT = "no_such_module_for_ftprof_tests"

SAMPLE = f"""
import pytest

from tests.requires import method_param, requires, skip_without


@requires("{ABSENT}")
def test_absent():
    raise AssertionError("ran without its package")


@requires("json")
def test_present():
    pass


@pytest.mark.parametrize("value", [pytest.param("needs it", marks=requires("json", "{ABSENT}")), "plain"])
def test_each_parameter(value):
    assert value == "plain"


def test_inside():
    skip_without("json")
    skip_without("{ABSENT}")
    raise AssertionError("ran past skip_without")


@pytest.mark.parametrize("method", [method_param("full")])
def test_full_needs_nothing_optional(method):
    pass
"""


def test_a_missing_package_skips_with_the_reason_and_a_present_one_runs(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    out = subprocess.run([sys.executable, "-m", "pytest", "-rs", "-q", "-p", "no:cacheprovider", "test_sample.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**_env(), "PYTHONPATH": str(ROOT)})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "3 passed, 3 skipped" in text, text
    why = f"needs the optional package '{ABSENT}' (pip install {ABSENT})"
    skipped = [line for line in text.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 3 and all(line.endswith(why) for line in skipped), skipped
    assert "'json'" not in text  # an installed package is never named as missing


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}


def test_a_methods_parameter_skips_where_its_package_is_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gptqmodel" else real(name, *a))
    (gptq,) = req.method_param("gptq-lora").marks
    assert gptq.args == (True,)
    assert gptq.kwargs["reason"] == "needs the optional package 'gptqmodel' (pip install 'ftprof[gptq]')"
    for method in ("full", "lora", "qlora"):
        assert req.method_param(method).marks[0].args == (False,), method


def test_what_a_run_needs():
    assert req.run_packages("full") == ()
    assert req.run_packages("lora", kernels="liger") == ("peft", "liger_kernel")
    assert req.run_packages("qlora", compile=True, dequant_kernel="triton") == ("peft", "bitsandbytes", "triton")
    assert req.run_packages("qlora", lora_fused_projections=True) == ("peft", "bitsandbytes", "triton")
    assert req.run_packages("lora", lora_fused_projections=True) == ("peft",)  # 16-bit weights: no 4-bit kernel
    assert req.run_packages("gptq-lora") == ("peft", "gptqmodel")


def test_a_dotted_name_under_a_missing_package_is_missing():
    assert req.missing(f"{ABSENT}.sub", "json") == [f"{ABSENT}.sub"]


def test_every_method_is_known():
    from ftprof.config import METHODS

    assert set(req.METHOD_PACKAGES) == set(METHODS)
    assert all(m in req.INSTALL for packages in req.METHOD_PACKAGES.values() for m in packages)
