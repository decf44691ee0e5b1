"""Every ok run proves it trained (ftprof.engine.proof): weights moved, frozen ones did not, gradient norms finite
and non-zero, every loss finite. Runs that did not train finish as ``not_trained`` with the reason."""

import json

import pytest
import torch

import ftprof
import ftprof.engine.trainer as trainer_module
from ftprof.engine.proof import GRAD_NORM_EVERY, TrainingCheck
from ftprof.results.status import Status
from tests.conftest import tiny_config
from tests.requires import method_param


def _result_json(tmp_path, result) -> dict:
    return json.loads((tmp_path / result.run_dir.split("/")[-1] / "result.json").read_text())


def _after_build(monkeypatch, change):
    """Run ``change(built)`` on the run's parts once they are built, before the first step."""
    real = trainer_module.build

    def build(*args, **kwargs):
        built = real(*args, **kwargs)
        change(built)
        return built

    monkeypatch.setattr(trainer_module, "build", build)


def _assert_not_trained(tmp_path, result, fragment: str) -> dict:
    assert result.status == Status.NOT_TRAINED.value, (result.status, result.failure.error_tail)
    assert fragment in result.failure.error_message, result.failure.error_message
    saved = _result_json(tmp_path, result)
    assert saved["status"] == "not_trained" and fragment in saved["error_message"]
    return saved


@pytest.mark.parametrize("method", ["full", "lora", "qlora", method_param("gptq-lora", pytest.mark.slow)])
def test_every_method_proves_it_trained(tmp_path, method):
    result = ftprof.train(tiny_config(tmp_path, method, max_steps=3))
    assert result.status == "ok", result.failure.error_tail
    proof = _result_json(tmp_path, result)["training_proof"]
    assert proof["passed"] and proof["reason"] is None and proof["trainable_changed"] >= 1
    assert proof["loss_steps_checked"] == 3 and proof["grad_norm_steps"] == [1, 3]
    assert 0 < proof["grad_norm_min"] <= proof["grad_norm_max"] < float("inf")
    assert proof["frozen_changed"] == 0
    if method == "full":
        assert proof["frozen_tensors"] == 0 and proof["trainable_changed"] == proof["trainable_tensors"]
    else:
        assert proof["frozen_tensors"] > 0


@pytest.mark.parametrize("flat", [dict(checkpointing="full"), dict(checkpointing="selective"),
                                  dict(checkpointing="full", checkpoint_layers=1), dict(max_grad_norm=0.0),
                                  dict(grad_accum=2), dict(prefetch=False), dict(lr_scheduler_type="cosine")])
def test_checkpointing_and_fast_paths_pass(tmp_path, flat):
    result = ftprof.train(tiny_config(tmp_path, "lora", max_steps=2, **flat))
    assert result.status == "ok", result.failure.error_tail
    assert result.training_proof.passed and result.training_proof.grad_norm_first > 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_loss_that_turns_non_finite_at_step_3_is_not_trained(tmp_path, monkeypatch, bad):
    calls = []

    def poison(module, args, kwargs, output):
        calls.append(1)
        if len(calls) >= 3:
            output.loss = output.loss * bad
        return output

    _after_build(monkeypatch, lambda built: built.model.register_forward_hook(poison, with_kwargs=True))
    result = ftprof.train(tiny_config(tmp_path, "lora", max_steps=6))
    saved = _assert_not_trained(tmp_path, result, f"loss became {bad} at step 3")
    assert result.run.steps_completed == 3  # one process stops at the first bad loss
    assert saved["training_proof"]["passed"] is False


def test_a_frozen_adapter_is_not_trained(tmp_path, monkeypatch):
    def freeze(built):
        for p in built.params:
            p.requires_grad_(False)

    _after_build(monkeypatch, freeze)
    result = ftprof.train(tiny_config(tmp_path, "lora", max_steps=2))
    _assert_not_trained(tmp_path, result, "depends on no trainable parameter")


def test_an_optimizer_that_moves_nothing_is_not_trained(tmp_path, monkeypatch):
    def inert(built):
        built.optimizer.step = lambda *args, **kwargs: None

    _after_build(monkeypatch, inert)
    result = ftprof.train(tiny_config(tmp_path, "lora", max_steps=2))
    saved = _assert_not_trained(tmp_path, result, "no trainable parameter changed")
    assert saved["training_proof"]["trainable_changed"] == 0


def test_a_frozen_weight_that_changes_is_not_trained(tmp_path, monkeypatch):
    def leak(built):
        frozen = next(p for n, p in built.model.named_parameters() if not p.requires_grad and "q_proj" in n)
        step = built.optimizer.step

        def leaky_step(*args, **kwargs):
            with torch.no_grad():
                frozen.add_(1.0)
            return step(*args, **kwargs)

        built.optimizer.step = leaky_step

    _after_build(monkeypatch, leak)
    result = ftprof.train(tiny_config(tmp_path, "lora", max_steps=2))
    saved = _assert_not_trained(tmp_path, result, "frozen parameter")
    assert "q_proj" in saved["error_message"] and saved["training_proof"]["frozen_changed"] >= 1


def test_zero_gradients_are_not_trained(tmp_path, monkeypatch):
    def zero_grads(built):
        for p in built.params:
            p.register_hook(lambda grad: torch.zeros_like(grad))

    _after_build(monkeypatch, zero_grads)
    result = ftprof.train(tiny_config(tmp_path, "full", max_steps=2, weight_decay=0.0))
    _assert_not_trained(tmp_path, result, "gradient norm 0 at step 1")


def test_not_trained_exits_5_from_the_command_line(tmp_path, monkeypatch, capsys):
    from ftprof.cli.main import main

    _after_build(monkeypatch, lambda built: setattr(built.optimizer, "step", lambda *a, **k: None))
    code = main(["train", "lora", "--device", "cpu", "--max-steps", "3", "--output-dir", str(tmp_path), "--quiet"])
    assert code == Status.NOT_TRAINED.exit_code == 5
    out = capsys.readouterr()
    assert "no trainable parameter changed" in out.out + out.err


def test_gradient_norm_is_read_on_the_first_every_nth_and_last_step():
    check = TrainingCheck(torch.nn.Linear(2, 2), max_steps=2 * GRAD_NORM_EVERY + 3)
    wanted = [s for s in range(1, check.max_steps + 1) if check.wants_grad_norm(s)]
    assert wanted == [1, GRAD_NORM_EVERY, 2 * GRAD_NORM_EVERY, check.max_steps]


def test_a_non_finite_loss_of_float16_weights_points_at_the_dtype():
    """--fp16 trains float16 weights with no loss scaling (not the HF Trainer's mixed precision): its overflow is
    named as such, and a float32 run's is not."""
    import torch

    from ftprof.engine.proof import TrainingCheck

    for dtype, hinted in ((torch.float16, True), (torch.float32, False)):
        check = TrainingCheck(torch.nn.Linear(2, 2).to(dtype), max_steps=3)
        check.observe(2, float("nan"), None)
        assert check.bad_loss.startswith("loss became nan at step 2") and ("--bf16" in check.bad_loss) is hinted
