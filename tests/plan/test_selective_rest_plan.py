"""--selective-rest in the planner: full on N of L layers with selective on the rest, sized as each layer's policy
saves, priced as each layer's policy runs until a run of its own is recorded, proposed by ftprof plan and chosen by
--checkpointing auto where it recomputes fewer layers in the same memory. Planned from the CPU for an H200 on an
8-layer checkpoint of the tiny shape (the probe builds two layers); the speed mix on llama-1b (slow: its probe)."""

from __future__ import annotations

import dataclasses

import pytest

from ftprof.metrics import GIB
from ftprof.plan import budget, calibration, candidates, make
from ftprof.plan.candidates import policy_words
from ftprof.plan.predict import Target
from tests.data_files import save_checkpoint
from tests.plan.planners import H200, planner_for

REST = "selective_rest"


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("deep") / "ckpt", layers=8)


def _planner(model, target=H200, method="lora", seq_len=512, checkpointing="full", **flat):
    return planner_for(model, method, seq_len=seq_len, batch_size=4, target=target, checkpointing=checkpointing,
                       **flat)


def _full(cand, layers=None, rest=False):
    cand = dataclasses.replace(cand, checkpointing="full", checkpoint_layers=layers)
    return cand.with_option(REST) if rest else cand


def test_the_rest_is_sized_at_selectives_activations(deep):
    p, cand = _planner(deep, target=Target("cpu"))  # the CPU: the probe's bytes, no calibration factor
    probe, tokens = p.probe("lora"), 4 * 512
    layer = probe.per_layer
    rest, plain = p.predict(_full(cand, 3, rest=True)), p.predict(_full(cand, 3))
    # five layers at selective's bytes instead of none's
    per_layer = (layer.activations["none"] - layer.activations["selective"]) * tokens + \
        layer.activations_fixed["none"] - layer.activations_fixed["selective"]
    assert plain.activation_bytes - rest.activation_bytes == pytest.approx(5 * per_layer, rel=1e-6)
    every = p.predict(_full(cand))
    assert every.peak_bytes < rest.peak_bytes < plain.peak_bytes


def test_a_run_of_it_is_a_class_of_its_own_and_only_under_partial_full_checkpointing():
    record = {"method": "qlora", "policy": "full", "checkpointed_layers": 6, "kernels": "liger", "compile": True,
              "knobs": {REST: True, "fp8_base": True}}
    assert calibration.class_key(record).options == (("fp8_base", True), (REST, True))
    assert calibration.class_key(record).base.options == ()  # what it saves: full's factor and selective's
    every = {**record, "checkpointed_layers": None}  # no rest to be selective: the option does nothing
    assert calibration.class_key(every).options == (("fp8_base", True),)


def test_plan_proposes_it_with_fewer_layers_than_full_alone(deep):
    p, cand = _planner(deep, compile=True)
    budget_bytes = (p.predict(_full(cand, 3, rest=True)).peak_bytes + p.predict(_full(cand, 3)).peak_bytes) // 2
    found = make._fewest_layers(p, [_full(cand)], budget_bytes)
    by_rest = {bool(c.option(REST)): c.checkpoint_layers for c in found if not c.option(budget.LEAN_ACT)}
    assert by_rest[True] == 3 and by_rest[False] == 4, found
    rest = next(c for c in found if c.option(REST))
    assert policy_words(rest, p.layer_count) == "full on 3 of 8 layers, selective on the rest"
    assert rest.flat()[REST] is True  # the command and the sweep file carry --selective-rest


def test_auto_takes_it_where_it_recomputes_fewer_layers_and_records_it(deep, monkeypatch):
    from ftprof.resolved import selective_rest_of

    monkeypatch.setattr(budget, "kept_lean", lambda planner, cand: [])  # (the rest against full alone)

    p, cand = _planner(deep, compile=True, checkpointing="auto")
    between = (p.predict(_full(cand, 3, rest=True)).peak_bytes + p.predict(_full(cand, 3)).peak_bytes) // 2
    choice, pred, record, fits = budget.auto_policy(p, cand, GIB + between)  # (a 1 GiB margin at this size)
    assert fits and (choice.checkpointing, choice.checkpoint_layers, choice.option(REST)) == ("full", 3, True)
    assert record.selective_rest is True and (record.policy, record.layers) == ("full", 3)
    assert "full on 3 of 8 layers, selective on the rest" in record.reason
    assert selective_rest_of(p.cfg, record) and not selective_rest_of(p.cfg, dataclasses.replace(record, layers=None))


def test_it_is_not_tried_under_cuda_graphs_or_another_policy(deep):
    _, cand = _planner(deep, compile=True)
    graphs = dataclasses.replace(cand, options=(("compile_mode", "reduce-overhead"),))
    assert budget.rest_applies(cand) and not budget.rest_applies(graphs)
    assert not budget.rest_applies(dataclasses.replace(cand, checkpointing="selective"))


def test_a_pinned_layer_count_with_it_plans_it():
    pool = candidates.enumerate_candidates(["lora"], 8, 4, 1)
    pinned = candidates.pinned(pool, {"checkpointing": "full", "checkpoint_layers": 3, REST: True})
    assert pinned and all(c.checkpoint_layers == 3 and c.option(REST) for c in pinned)


@pytest.mark.slow  # probes llama-1b on the CPU (about 20 s): the tiny shapes are host-bound, every policy alike
def test_its_speed_is_each_layers_policys_until_a_run_of_it_is_recorded():
    p, cand = _planner("llama-1b", method="qlora", kernels="liger", compile=True, fp8_base=True, seq_len=2048)
    rest, plain = p.predict(_full(cand, 8, rest=True)), p.predict(_full(cand, 8))  # of the preset's 16
    every, selective = p.predict(_full(cand)), p.predict(dataclasses.replace(cand, checkpointing="selective"))
    # the rest runs slower than none's, faster than full's; the memory it saves buys fewer full layers
    assert every.tokens_per_s < rest.tokens_per_s < min(plain.tokens_per_s, selective.tokens_per_s)
    assert rest.peak_bytes < plain.peak_bytes
    assert "full on 8 of 16 layers, the rest at selective's rate" in rest.speed_source
    assert rest.tokens_per_s_error > plain.tokens_per_s_error  # priced from two classes, neither of it
    # once a run of its class is recorded, it answers
    measured = {"source": "run", "device_name": H200.device_name, "model": "llama-1b", "method": "qlora",
                "policy": "full", "checkpointed_layers": 8, "kernels": "liger", "compile": True,
                "knobs": {**calibration.DEFAULT_KNOBS, "fp8_base": True, REST: True}, "micro_batch_tokens": 8192,
                "flops_per_token": 1.0e10, "flops_per_s": 4.0e14, "tokens_per_s": 30000.0, "world_size": 1}
    recorded = dataclasses.replace(p, records=[measured])
    assert "the rest at selective's rate" not in recorded.predict(_full(cand, 8, rest=True)).speed_source


def test_the_store_files_an_auto_run_that_chose_it_under_its_class(tmp_path):
    import json

    config = {"schema_version": 1, "model": {"model": "tiny", "checkpointing": "auto"}, "method": {"method": "lora"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "result.json").write_text(json.dumps({
        "status": "ok", "tokens_per_s": 1000.0, "flops_per_token": 1e6, "finished_at": "2026-12-05T00:00:00",
        "method": "lora", "checkpointing_policy": "full", "checkpointed_layers": 1,
        "checkpointing_auto": {"policy": "full", "layers": 1, "selective_rest": True}}))
    record = calibration.run_record(tmp_path)
    assert record["knobs"][REST] is True and calibration.class_key(record).options == ((REST, True),)


def test_a_plan_pinned_without_it_lists_none_of_it():
    from ftprof.config import RunConfig
    from ftprof.plan.make import PlanRequest, make_plan

    cfg = RunConfig.from_flat({"model": "tiny", "method": "lora", "seq_len": 64, "batch_size": 2,
                               "selective_rest": False})
    rows = make_plan(PlanRequest(cfg, ("lora",), pins=((REST, False),))).rows
    assert rows and not any(r.candidate.option(REST) for r in rows)


def test_the_closest_fit_advice_turns_it_off_where_every_layer_is_checkpointed():
    from ftprof.plan.candidates import Candidate

    asked = Candidate("lora", "full", 6, "eager", True, 4, 1, ((REST, True),))
    every = Candidate("lora", "full", None, "eager", True, 4, 1)
    assert budget.describe_change(asked, every) == "--no-selective-rest (all layers)"
