"""Tests that need an optional package skip, naming it, where it is not installed: one helper for the CPU tests and
the GPU tests alike (a GPU machine without gptqmodel skips gptq-lora's tests instead of failing them).

    @requires("hta")                                   # a test, or a module's ``pytestmark``
    pytest.param("gptq-lora", marks=requires("gptqmodel"))   # one parameter of many
    @pytest.mark.parametrize("method", method_params(METHODS))   # each method with the packages it trains with
    @requires_run("qlora", compile=True)               # what one run needs (run_packages)
    skip_without("hta")                                # inside a test: the part after it needs the package

Packages are found (``importlib.util.find_spec``), not imported, so a module's marks cost nothing at collection.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

import pytest

# import name -> how to install it (the ftprof extra where there is one)
INSTALL = {
    "gptqmodel": "pip install 'ftprof[gptq]'",
    "bitsandbytes": "pip install bitsandbytes",
    "peft": "pip install peft",
    "liger_kernel": "pip install 'ftprof[fast]'",
    "triton": "pip install triton",
    "datasets": "pip install 'ftprof[data]'",
    "pynvml": "pip install nvidia-ml-py",
    "hta": "pip install holistictraceanalysis",
    "tensorboard": "pip install 'ftprof[tensorboard]'",
    "mlflow": "pip install 'ftprof[mlflow]'",
    "wandb": "pip install 'ftprof[wandb]'",
    "matplotlib": "pip install 'ftprof[plots]'",
    "plotly": "pip install 'ftprof[plots]'",
}

# what each method trains with beyond torch and transformers (ftprof.checks.check_packages asks for the same)
METHOD_PACKAGES = {"full": (), "lora": ("peft",), "qlora": ("peft", "bitsandbytes"),
                   "gptq-lora": ("peft", "gptqmodel")}


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a dotted name whose parent is missing, or a module loaded without a spec
        return False


def missing(*modules: str) -> list[str]:
    return [m for m in dict.fromkeys(modules) if not installed(m)]


def reason(modules: Iterable[str]) -> str:
    """``needs the optional package 'gptqmodel' (pip install 'ftprof[gptq]')``, one clause per package."""
    return "needs " + ", ".join(f"the optional package '{m}' ({INSTALL.get(m, f'pip install {m}')})" for m in modules)


def requires(*modules: str) -> pytest.MarkDecorator:
    """A skip mark, naming what is missing, unless every module is installed."""
    absent = missing(*modules)
    return pytest.mark.skipif(bool(absent), reason=reason(absent or modules))


def skip_without(*modules: str) -> None:
    """Inside a test: skip it here, naming what is missing, unless every module is installed."""
    absent = missing(*modules)
    if absent:
        pytest.skip(reason(absent))


def run_packages(method: str, **flat) -> tuple[str, ...]:
    """The optional packages a CUDA run of ``method`` with these options needs: the method's own, Liger for
    ``kernels=liger``, Triton for ``compile`` (Inductor's GPU kernels), ``dequant_kernel=triton``, ``fp8_base`` and
    QLoRA's ``lora_fused_projections`` (ftprof's Triton kernels)."""
    packages = list(METHOD_PACKAGES[method])
    if flat.get("kernels") == "liger":
        packages.append("liger_kernel")
    triton = flat.get("compile") or flat.get("dequant_kernel") == "triton" or flat.get("fp8_base") or (
        method == "qlora" and flat.get("lora_fused_projections"))
    if triton:
        packages.append("triton")
    return tuple(dict.fromkeys(packages))


def requires_run(method: str, **flat) -> pytest.MarkDecorator:
    """A skip mark unless every package a CUDA run of ``method`` with these options needs is installed."""
    return requires(*run_packages(method, **flat))


def method_param(method: str, *marks, **flat):
    """``method`` as one parameter, skipped where a package its run needs (``run_packages``) is missing."""
    return pytest.param(method, marks=[requires_run(method, **flat), *marks])


def method_params(methods: Iterable[str], **flat) -> list:
    return [method_param(m, **flat) for m in methods]
