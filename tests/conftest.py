import logging
import os
import warnings

import pytest

import ftprof.runtime  # noqa: F401 - quiets noisy library loggers before they import
from ftprof.config import RunConfig


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """GPTQ checkpoints quantized by tests, and datasets' caches, go to a session temp dir, not the user's cache."""
    os.environ["FTPROF_CACHE_DIR"] = str(tmp_path_factory.mktemp("ftprof-cache"))
    os.environ["HF_DATASETS_CACHE"] = str(tmp_path_factory.mktemp("hf-datasets"))  # read when datasets is imported
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    yield


@pytest.fixture(autouse=True)
def _restore_process_state():
    """Each test leaves the process as it found it, so that what one test ran never shapes a later test on the
    same pytest worker: environment variables (importing peft imports gptqmodel, which sets PYTORCH_ALLOC_CONF,
    CUDA_DEVICE_ORDER and HF_* cache paths, and runs forward PYTORCH_ALLOC_CONF into their children; --quiet sets
    library verbosities), logging's disable level and the warnings filters (--quiet turns both off)."""
    env, disabled, filters = dict(os.environ), logging.root.manager.disable, list(warnings.filters)
    yield
    if dict(os.environ) != env:
        os.environ.clear()
        os.environ.update(env)
    logging.disable(disabled)
    warnings.filters[:] = filters


def pytest_configure(config):
    from tests.xdist_order import share_cores

    share_cores()  # under xdist: each worker its share of the cores (tests/xdist_order.py)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own, which would answer first
def pytest_xdist_make_scheduler(config, log):
    from tests.xdist_order import make_scheduler

    return make_scheduler(config, log)  # --dist loadfile: the heavy files first (tests/xdist_order.py)


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def tiny_config(tmp_path, method="full", **flat) -> RunConfig:
    """A quick run on the tiny preset: CPU, quiet, into tmp_path."""
    values = dict(method=method, model="tiny", seq_len=32, batch_size=4, max_steps=4, measure_warmup_steps=1,
                  output_dir=str(tmp_path), quiet=True, device="cpu")
    values.update(flat)
    return RunConfig.from_flat(values)


def assert_train_refuses(tmp_path, capsys, method: str, argv: list[str], fragment: str) -> None:
    """``ftprof train METHOD ARGV`` on the CPU exits 2 with one line naming the problem (``fragment``), before it
    writes anything into tmp_path."""
    from ftprof.cli.main import main

    try:
        code = main(["train", method, "--device", "cpu", "--output-dir", str(tmp_path), *argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def build_run(cfg: RunConfig):
    """(ResolvedRun, Built) for a config: the model, optimizer and data a run would train, without the loop."""
    from ftprof.engine.build import build
    from ftprof.preflight import preflight
    from ftprof.profiling.memory import MemoryTracker

    resolved = preflight(cfg)
    return resolved, build(resolved, MemoryTracker(resolved.device), lambda _: None)


def two_step_grads(tmp_path, method: str, checkpointing: str = "full", **flat):
    """A (full-checkpointed) tiny run's LoRA (or full) gradients after each of two accumulated forward+backward
    passes (LoRA's B drawn non-zero, so every A gets a gradient): (built, [grads after one, grads after two])."""
    import torch

    resolved, built = build_run(tiny_config(tmp_path, method, checkpointing=checkpointing, seq_len=32, **flat))
    with torch.no_grad():  # PEFT's zero B would leave every A without a gradient
        for name, p in built.model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
    grads = []
    for _ in range(2):  # two micro-batches' worth, accumulated: pending inputs are cleared between them
        run_one_step(resolved, built)
        grads.append({n: p.grad.clone() for n, p in built.model.named_parameters() if p.grad is not None})
    return built, grads


def run_one_step(resolved, built) -> None:
    """Forward and backward of one step (no optimizer step), as the loop runs them."""
    from ftprof.engine.loop import train_step
    from ftprof.engine.trackers import FirstStepMemory
    from ftprof.profiling.memory import MemoryTracker

    train_step(resolved.config, built, resolved.device, MemoryTracker(resolved.device), FirstStepMemory(False),
               is_first=False)
