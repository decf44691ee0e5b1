"""Runs of other trainers in the calibration store: a run measured through ftprof.integrations (a peer recipe, a
user's Trainer or loop) is recorded with its trainer; the planner calibrates ftprof's loop from ftprof's runs only,
and the plan lists what the other trainers measured at its model and shape."""

from __future__ import annotations

import json

import torch

from ftprof.plan import calibration, store


def _store(tmp_path, monkeypatch):
    path = tmp_path / "calibration.jsonl"
    monkeypatch.setenv(store.STORE_ENV, str(path))
    return path


def test_a_measured_loop_is_recorded_with_its_trainer_and_kept_from_calibration(tmp_path, monkeypatch):
    from ftprof.integrations import measure
    from tests.integrations.tiny import VOCAB, tiny_llama

    _store(tmp_path, monkeypatch)
    model = tiny_llama(lora=True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with measure(model, tmp_path / "run", optimizer=opt, max_steps=5) as m:
        for _ in range(5):
            ids = torch.randint(3, VOCAB, (2, 32), generator=g)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            m.step()
    records = store.load_records()
    assert len(records) == 1
    trainer = json.loads((tmp_path / "run" / "config.json").read_text())["trainer"]["name"]
    assert records[0]["trainer"] == trainer != "ftprof"
    assert calibration.own_records() == []  # the planner never calibrates ftprof's loop from it
    peers = calibration.peer_records("cpu", records[0]["model"], 32, 2, ("lora",))
    assert [p["run_dir"] for p in peers] == [str((tmp_path / "run").resolve())]
    assert calibration.peer_records("cpu", records[0]["model"], 32, 4, ("lora",)) == []  # another shape
    assert calibration.peer_records("cpu", records[0]["model"], 32, 2, ("qlora",)) == []  # another method


def test_the_plan_lists_other_trainers_beside_its_rows(tmp_path, monkeypatch):
    """An Unsloth run of the plan's model and shape in the store: the plan names it (plan.json and the console
    lines), and its speed does not move the plan's own predictions."""
    from ftprof.config import RunConfig
    from ftprof.plan import output
    from ftprof.plan.make import PlanRequest, make_plan

    path = _store(tmp_path, monkeypatch)
    cfg = RunConfig.from_flat({"model": "tiny", "method": "lora", "seq_len": 64, "batch_size": 2,
                               "output_dir": str(tmp_path)})
    before = make_plan(PlanRequest(cfg, ("lora",)))
    assert before.peers == [] and output.peer_lines(before) == []
    peer = {"run_key": "peer@1", "source": "run", "trainer": "unsloth", "run_dir": "/runs/u",
            "finished_at": "2026-12-03", "device_name": "cpu", "model": "tiny", "layers": 2, "method": "lora",
            "policy": "none",
            "checkpointed_layers": None, "kernels": "eager", "compile": False, "knobs": {}, "seq_len": 64,
            "batch_size": 2, "micro_batch_tokens": 128, "grad_accum": 1, "world_size": 1, "flops_per_token": 1e6,
            "recompute_flops_per_token": 0.0, "tokens_per_s": 1e6, "flops_per_s": 1e12, "training_peak": None,
            "prediction": {}, "gpu_busy": None}
    assert store.problem(peer) is None
    path.write_text(json.dumps(peer) + "\n")
    plan = make_plan(PlanRequest(cfg, ("lora",)))
    assert [p["trainer"] for p in plan.peers] == ["unsloth"]
    lines = output.peer_lines(plan)
    assert "unsloth: lora, checkpointing none, 2 x 1: 1,000,000 tokens/s" in lines[1]
    assert output.plan_json(plan)["peers"][0]["trainer"] == "unsloth"
    speeds = lambda p: [r.prediction.tokens_per_s for r in p.rows]  # noqa: E731
    assert speeds(plan) == speeds(before)  # calibrated from ftprof's runs alone
