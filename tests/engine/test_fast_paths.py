"""Fast paths as run options on CPU: checkpointing policies (numerics and memory), auto's choice, compile, and the
one-line errors for what cannot run here. The GPU numerics against eager are in tests/gpu/test_gpu_fast_paths.py."""

import json

import pytest

import ftprof
from ftprof.cli.main import main
from ftprof.engine.checkpointing import choose
from tests.conftest import tiny_config

GIB = 1 << 30


@pytest.fixture(scope="module")
def policy_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("policies")
    return {p: ftprof.train(tiny_config(out / p, "lora", checkpointing=p, max_steps=3, seq_len=64, lr=3e-3))
            for p in ("none", "selective", "full")}


def test_policies_train_the_same_numbers(policy_runs):
    losses = {p: (r.loss_first, r.loss_last) for p, r in policy_runs.items()}
    assert all(r.status == "ok" for r in policy_runs.values())
    assert losses["selective"] == pytest.approx(losses["none"], rel=1e-5)
    assert losses["full"] == pytest.approx(losses["none"], rel=1e-5)


def test_selective_keeps_less_than_none_and_more_than_full(policy_runs):
    saved = {p: r.memory_breakdown["activations_saved"] for p, r in policy_runs.items()}
    assert saved["full"] < saved["selective"] < saved["none"], saved
    assert {p: r.checkpointing_policy for p, r in policy_runs.items()} == {p: p for p in policy_runs}
    # HFU counts what is recomputed: the layers' matmuls under full, none under selective
    assert policy_runs["full"].recompute_flops_per_token > 0
    assert policy_runs["selective"].recompute_flops_per_token == 0


def test_auto_records_its_choice_and_estimates(tmp_path):
    result = ftprof.train(tiny_config(tmp_path, "lora", checkpointing="auto", max_steps=2, run_name="a"))
    auto = result.checkpointing_auto
    assert result.status == "ok" and result.checkpointing_policy == auto["policy"] == "none"  # tiny fits anywhere
    est = auto["estimated_peak"]
    assert est["none"] > est["selective"] > est["full"] > auto["static_bytes"] > 0
    assert "fits" in auto["reason"]
    assert json.loads((tmp_path / "a" / "config.json").read_text())["model"]["checkpointing"] == "auto"


@pytest.mark.parametrize("available, expected", [(100 * GIB, "none"), (40 * GIB, "selective"), (20 * GIB, "full"),
                                                 (5 * GIB, "full")])
def test_auto_picks_the_fastest_policy_that_fits(available, expected):
    estimates = {"none": 60 * GIB, "selective": 30 * GIB, "full": 15 * GIB}
    policy, margin, reason = choose(estimates, available)
    assert policy == expected and margin >= GIB
    assert estimates[policy] <= available - margin or "no policy" in reason


@pytest.mark.slow
def test_compile_matches_eager_on_cpu(tmp_path):
    eager = ftprof.train(tiny_config(tmp_path / "e", "lora", max_steps=3))
    compiled = ftprof.train(tiny_config(tmp_path / "c", "lora", max_steps=3, compile=True))
    assert compiled.status == "ok" and compiled.compile["blocks"] == 2
    if compiled.compile["compiled"]:
        assert compiled.compile_time_s > 0
        assert compiled.loss_last == pytest.approx(eager.loss_last, rel=1e-3)
    else:  # no working C++ toolchain for inductor here: the run fell back to eager and said why
        assert compiled.compile["fallback"] and any("--compile" in n for n in compiled.notes)
        assert compiled.loss_last == pytest.approx(eager.loss_last, rel=1e-6)


@pytest.mark.slow
def test_compile_under_full_checkpointing_keeps_the_checkpoint(tmp_path, policy_runs):
    """Under full checkpointing the blocks' children are compiled, so torch's checkpoint stays outside compiled code:
    the run keeps as little for backward as eager full checkpointing and trains the same numbers."""
    run = ftprof.train(tiny_config(tmp_path, "lora", checkpointing="full", compile=True, max_steps=3, seq_len=64,
                                   lr=3e-3))
    assert run.status == "ok", run.error_message
    assert run.compile["compiled"], run.compile
    assert run.compile["scope"] == "block children" and run.compile["blocks"] == 2
    saved = {p: r.memory_breakdown["activations_saved"] for p, r in policy_runs.items()}
    assert run.memory_breakdown["activations_saved"] <= saved["full"] * 1.1 < saved["none"], (run.memory_breakdown,
                                                                                             saved)
    assert (run.loss_first, run.loss_last) == pytest.approx((policy_runs["full"].loss_first,
                                                             policy_runs["full"].loss_last), rel=1e-3)


@pytest.mark.parametrize("argv, fragment", [
    (["--kernels", "liger"], "--kernels liger needs a CUDA device"),
    (["--sdpa-backend", "cudnn"], "--sdpa-backend cudnn needs a CUDA device"),
    (["--sdpa-backend", "fast"], "invalid choice"),
    (["--kernels", "liger", "--lora-targets", "q_proj,lm_head"], "--lora-targets lm_head"),
    (["--no-gradient-checkpointing", "--checkpointing", "full"], "contradicts --checkpointing full"),
    (["--checkpointing", "sometimes"], "invalid choice"),
    (["--checkpointing", "auto", "--nproc-per-node", "2"], "--checkpointing auto estimates one process"),
])
def test_fast_path_bad_input_is_one_line(tmp_path, capsys, argv, fragment):
    try:
        code = main(["train", "lora", "--device", "cpu", "--output-dir", str(tmp_path), *argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []
