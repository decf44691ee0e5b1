"""ftprof.runtime: what noisy third-party imports leave behind is undone."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_run_leaves_no_model_alive_in_the_process(tmp_path):
    """After ftprof.train() returns, nothing of the run's model survives, in a fresh interpreter (where the run is the
    first to import gptqmodel, whose stored import errors held the importing frames and so the model)."""
    script = textwrap.dedent(f"""
        import gc, sys, torch, ftprof
        sys.path.insert(0, {str(REPO)!r})
        from tests.conftest import tiny_config
        result = ftprof.train(tiny_config({str(tmp_path)!r}, "lora", max_steps=2))
        assert result.status == "ok", result.failure.error_message
        gc.collect()
        alive = [o for o in gc.get_objects() if isinstance(o, torch.nn.Parameter)]
        print("alive parameters:", len(alive), sum(p.numel() for p in alive))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "alive parameters: 0 0" in done.stdout, done.stdout[-2000:]
