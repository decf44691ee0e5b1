"""--checkpointing auto prices --offload-checkpoints like every other way full checkpointing fits: on a CUDA target
it takes the offload where only it fits or where it lets fewer layers be recomputed, says so in its reason and its
record, and leaves it alone where the plain way does as well (in 16 bits the offload with --lean-recompute splits each
layer in two halves, priced faster: there it takes it); on the CPU (a plain copy there) it never tries it.
Planned from the CPU for an H200 on an 8-layer checkpoint of the tiny shape (the probe builds two layers)."""

from __future__ import annotations

import dataclasses

import pytest

from ftprof.metrics import GIB
from ftprof.plan import budget
from ftprof.plan.predict import Target
from ftprof.results.parts import AutoChoice
from tests.data_files import save_checkpoint
from tests.plan.planners import H200, planner_for


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("deep") / "ckpt", layers=8)


@pytest.fixture(autouse=True)
def _without_a_selective_rest(monkeypatch):
    """The offload against plain full checkpointing alone: with a selective rest, or the lean options on the layers
    left unchecked, auto recomputes fewer layers still (tests/plan/test_selective_rest_plan.py,
    tests/plan/test_auto_lean.py)."""
    monkeypatch.setattr(budget, "rest_applies", lambda cand: False)
    monkeypatch.setattr(budget, "kept_lean", lambda planner, cand: [])


def _planner(deep, target=H200, **flat):
    return planner_for(deep, "lora", seq_len=512, batch_size=4, target=target, checkpointing="auto", **flat)


def _peak(p, cand, layers=None, offload=False):
    full = dataclasses.replace(cand, checkpointing="full", checkpoint_layers=layers)
    return p.predict(full.with_option(budget.OFFLOAD) if offload else full).peak_bytes


def _auto(p, cand, budget_bytes):
    return budget.auto_policy(p, cand, GIB + budget_bytes)  # these budgets are small: the margin is 1 GiB


def test_auto_takes_the_offload_where_only_it_fits(deep):
    p, cand = _planner(deep)
    plain, offloaded = _peak(p, cand), _peak(p, cand, offload=True)
    assert offloaded < plain  # eight layer inputs leave, two come back
    choice, pred, record, fits = _auto(p, cand, (plain + offloaded) // 2)
    assert fits and choice.checkpointing == "full" and choice.checkpoint_layers is None
    assert choice.option("offload_checkpoints") is True and pred.peak_bytes == offloaded
    assert record.offload is True and (record.policy, record.layers) == ("full", None)
    assert "--offload-checkpoints" in record.reason and "without the offload full does not fit" in record.reason


def test_auto_takes_the_offload_where_it_recomputes_fewer_layers(deep):
    p, cand = _planner(deep)
    assert _peak(p, cand, 7) < _peak(p, cand, 6, offload=True) < _peak(p, cand, 6)
    between = (_peak(p, cand, 6, offload=True) + _peak(p, cand, 6)) // 2  # plain needs 7 layers, offloaded 6
    choice, pred, record, fits = _auto(p, cand, between)
    assert fits and (record.policy, record.layers, record.offload) == ("full", 6, True), record.reason
    assert "full on 6 of 8 layers with --offload-checkpoints" in record.reason
    assert "without the offload full on 7 of 8 layers fits but recomputes more layers" in record.reason
    assert pred.tokens_per_s > p.predict(dataclasses.replace(cand, checkpointing="full",
                                                              checkpoint_layers=7)).tokens_per_s


def test_auto_leaves_the_offload_off_where_the_plain_way_does_as_well(deep):
    p, cand = _planner(deep, fp8_base=True)  # (no --lean-recompute under FP8: the offload splits no layer)
    choice, _, record, fits = _auto(p, cand, _peak(p, cand, 6))  # both fit on 6 layers: no offload needed
    assert fits and (record.layers, record.offload) == (6, False) and choice.options == (("fp8_base", True),)
    assert "offload" not in record.reason
    _, _, roomy, _ = _auto(p, cand, 64 * GIB)
    assert (roomy.policy, roomy.offload) == ("none", False)


def test_in_16_bits_auto_takes_the_offload_for_the_lean_halves(deep):
    """With --lean-recompute the offloaded layers are checkpointed as two halves (models/split_layer.py), whose
    recomputation leaves the attention's output projection out too: priced faster at the same layers."""
    p, cand = _planner(deep)
    choice, pred, record, fits = _auto(p, cand, _peak(p, cand, 6))  # both fit on 6 layers
    assert fits and (record.layers, record.offload, record.lean_recompute) == (6, True, True)
    assert "without the offload full on 6 of 8 layers fits but is predicted slower" in record.reason
    plain = dataclasses.replace(cand, checkpointing="full", checkpoint_layers=6).with_option(budget.LEAN)
    assert pred.tokens_per_s > p.predict(plain).tokens_per_s


def test_auto_does_not_try_the_offload_on_the_cpu(deep):
    gpu, cand = _planner(deep)
    cpu, _ = _planner(deep, Target("cpu"))
    between = (_peak(gpu, cand) + _peak(gpu, cand, offload=True)) // 2
    assert _peak(cpu, cand) > between  # on the CPU nothing fits this budget: the offload is not tried
    choice, _, record, fits = _auto(cpu, cand, between)
    assert not fits and record.offload is False and choice.options == (("lean_recompute", True),)
    assert "offload" not in record.reason and record.reason.startswith("no policy fits")
    _, _, gpu_refusal, gpu_fits = _auto(gpu, cand, _peak(gpu, cand, offload=True) - 1)
    assert not gpu_fits and "full with --offload-checkpoints" in gpu_refusal.reason  # the least memory it tried


def test_auto_does_not_try_the_offload_where_its_declaration_refuses_it(deep):
    p, cand = _planner(deep, compile=True, compile_mode="reduce-overhead")  # copies outside the CUDA graphs
    assert not budget.offload_applies(p, dataclasses.replace(cand, checkpointing="full"))
    between = (_peak(p, cand) + _peak(p, cand, offload=True)) // 2
    _, _, record, fits = _auto(p, cand, between)
    assert not fits and record.offload is False


def test_an_auto_record_from_before_the_offload_loads_without_it():
    old = {"policy": "full", "reason": "full: fits", "layers": 3, "estimated_peak": {"none": 5}, "static_bytes": 1}
    choice = AutoChoice.from_dict(old)
    assert (choice.policy, choice.layers, choice.offload) == ("full", 3, False)
    assert AutoChoice("full", "why", offload=True).to_dict()["offload"] is True


def test_the_calibration_store_records_an_auto_run_s_offload(tmp_path):
    import json

    from ftprof.plan import calibration

    config = {"schema_version": 1, "model": {"model": "tiny", "checkpointing": "auto", "offload_checkpoints": False},
              "method": {"method": "lora"}}
    for offloaded, embedded in ((True, False), (False, False), (True, True), (False, True)):
        run_dir = tmp_path / f"{offloaded}-{embedded}"
        run_dir.mkdir()
        (run_dir / "config.json").write_text(json.dumps(config))
        (run_dir / "result.json").write_text(json.dumps({
            "status": "ok", "tokens_per_s": 1000.0, "flops_per_token": 1e6, "finished_at": "2026-12-03T00:00:00",
            "method": "lora", "checkpointing_policy": "full",
            "checkpointing_auto": {"policy": "full", "offload": offloaded, "host_embeddings": embedded}}))
        knobs = calibration.run_record(run_dir)["knobs"]
        assert knobs["offload_checkpoints"] is offloaded and knobs["offload_embeddings"] is embedded


def test_auto_s_options_are_one_vocabulary_of_declared_options_and_recorded_fields():
    """The options auto may choose, each with the field result.json records it in: what the store and the
    reports read (results/parts.AUTO_OPTIONS)."""
    import dataclasses as dc

    from ftprof.config import declarations
    from ftprof.results.parts import AUTO_OPTIONS, auto_chosen

    fields = {f.name for f in dc.fields(AutoChoice)}
    assert all(option in declarations.BY_NAME and name in fields for option, name in AUTO_OPTIONS)
    assert auto_chosen({"policy": "full", "offload": True, "host_embeddings": False}) == ["offload_checkpoints"]
    assert auto_chosen(None) == [] and auto_chosen({}) == []


def test_a_refusal_names_what_fits_with_host_memory_at_another_micro_batch(deep):
    """Within 8 GiB on an H200, llama-8b QLoRA 4 x 2048 fits only as 2 x 2 with the layer inputs and the table in
    host memory; auto's refusal had said nothing fits (2026-12-04). Below the least memory of every neighbour as
    asked, the refusal names the one that fits with host memory, as flags."""
    from ftprof.plan import for_run

    p, cand = _planner(deep)
    plain = [p.predict(c).peak_bytes for group in budget._neighbours(p, cand, ()) for c in group
             if not (c.option("offload_checkpoints") or c.option("offload_embeddings"))]
    ways = [p.predict(c).peak_bytes for group in budget._neighbours(p, cand, ()) for c in group]
    assert min(ways) < min(plain)  # host memory lowers the least peak
    full = dataclasses.replace(cand, checkpointing="full")
    line = for_run._refusal("--checkpointing auto", p, full, p.predict(full), min(plain) - 1)
    assert "nothing" not in line and "fits either" not in line, line
    assert "--offload-checkpoints" in line or "--offload-embeddings" in line, line
