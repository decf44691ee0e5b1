"""--lean-activations and --lean-norms beside partial full checkpointing: they trim the layers it leaves unchecked,
so that fewer layers need recomputing. Their measured cost (speed_cost) is paid in those layers only: priced by
their share of the layers. --checkpointing auto and ``ftprof plan`` try them there; a run built so (its first layer
checkpointed as the lean halves, the rest lean) trains to the plain partial run's gradients. Planned from the CPU
for an H200 on an 8-layer checkpoint of the tiny shape (the probe builds two layers)."""

from __future__ import annotations

import dataclasses

import pytest

from ftprof.config import declarations
from ftprof.metrics import GIB
from ftprof.plan import budget, memory
from ftprof.plan.predict import option_costs
from tests.conftest import two_step_grads
from tests.data_files import save_checkpoint
from tests.plan.planners import planner_for

ACT_COST = declarations.BY_NAME["lean_activations"].speed_cost  # their measured costs
NORM_COST = declarations.BY_NAME["lean_norms"].speed_cost


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("deep") / "ckpt", layers=8)


def _partial(cand, layers, *options):
    full = dataclasses.replace(cand, checkpointing="full", checkpoint_layers=layers)
    for name in options:
        full = full.with_option(name)
    return full


def test_their_cost_is_paid_on_the_layers_left_unchecked(deep):
    _, cand = planner_for(deep, "lora", seq_len=512, batch_size=4, checkpointing="auto")
    lean = _partial(cand, 6, budget.LEAN_ACT, budget.LEAN_NORMS)
    assert [memory.kept_layers(8, c) for c in (lean, _partial(cand, None), lean.with_option(budget.REST))] == [2, 0, 0]
    assert memory.kept_layers(8, dataclasses.replace(cand, checkpointing="none")) == 8
    selective = dataclasses.replace(cand, checkpointing="selective")
    assert [memory.kept_layers(8, dataclasses.replace(selective, checkpoint_layers=n)) for n in (None, 5)] == [0, 3]
    assert option_costs(lean, 2 / 8) == pytest.approx((1 - ACT_COST / 4) * (1 - NORM_COST / 4))
    assert option_costs(lean.with_option("fp8_base"), 0.0) == 1.0  # (FP8 declares no cost)


@pytest.mark.slow  # (the probe of the 8-layer checkpoint: about 4 s)
def test_auto_trims_the_layers_left_unchecked_where_that_recomputes_fewer(deep):
    p, cand = planner_for(deep, "lora", seq_len=512, batch_size=4, checkpointing="auto", fp8_base=True)
    plain, lean = (p.predict(_partial(cand, 6, *o)).peak_bytes for o in ((), (budget.LEAN_ACT,)))
    assert lean < plain  # two layers keep theirs: each less its SwiGLU product
    choice, _, record, fits = budget.auto_policy(p, cand, GIB + lean)  # (a 1 GiB margin here)
    assert fits and choice.checkpointing == "full" and choice.checkpoint_layers <= 6
    assert record.lean_activations is True and "--lean-activations" in record.reason
    assert "on the layers left unchecked" in record.reason
    ways = budget.full_ways(p, dataclasses.replace(cand, checkpointing="full", checkpoint_layers=None), lean)
    assert not any(c.option(budget.LEAN_ACT) and c.checkpoint_layers is None for c, _ in ways)  # (void there)


def test_auto_leaves_them_off_on_the_cpu(deep):
    from ftprof.plan.predict import Target

    p, cand = planner_for(deep, "lora", seq_len=512, batch_size=4, checkpointing="auto", target=Target("cpu"))
    assert budget.kept_lean(p, dataclasses.replace(cand, checkpointing="full", checkpoint_layers=None)) == []


@pytest.mark.slow
def test_the_lean_halves_with_a_lean_rest_train_as_the_plain_partial_run(tmp_path):
    """The tiny preset's first layer checkpointed as the lean halves with its inputs offloaded, the second lean:
    the gradients of two accumulated micro-batches within 1e-5 of the same partial run without the lean options
    (fp32; a norm's gradients are summed in another order)."""
    extra = dict(checkpoint_layers=1, lean_recompute=True, offload_checkpoints=True, dtype="float32")
    _, plain = two_step_grads(tmp_path / "p", "qlora", "full", **extra)
    _, lean = two_step_grads(tmp_path / "l", "qlora", "full", lean_activations=True, lean_norms=True, **extra)
    assert plain[0].keys() == lean[0].keys()
    for before, after in zip(plain, lean, strict=True):
        assert max(float((after[k] - g).abs().max() / g.abs().max()) for k, g in before.items()) < 1e-5
