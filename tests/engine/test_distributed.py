"""Two processes on CPU (gloo) under torchrun, launched by ftprof itself: FSDP2 and DDP, per-rank and aggregate."""

import csv
import json

import pytest

import ftprof
from ftprof.cli.common import config_from_args
from ftprof.cli.main import build_parser, main
from ftprof.engine.aggregate import aggregate_steps
from ftprof.engine.distributed import torchrun_command
from tests.conftest import tiny_config
from tests.requires import requires_run
from tests.tolerances import SAME_OPS


@pytest.mark.parametrize("method, parallel", [("full", "fsdp"), ("lora", "fsdp"), ("lora", "ddp"),
                                              ("qlora", "fsdp")])
@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
def test_two_process_run_on_cpu(tmp_path, method, parallel):
    cfg = tiny_config(tmp_path, method, nproc_per_node=2, parallel=parallel, max_steps=5, measure_warmup_steps=1,
                      run_name="d", lr=3e-3)
    result = ftprof.train(cfg)
    assert result.status == "ok", result.failure.error_message
    assert result.run.world_size == 2 and result.run.parallel == parallel
    run = tmp_path / "d"
    names = {p.name for p in run.iterdir()}
    assert {"steps.csv", "steps_rank0.csv", "steps_rank1.csv", "result.json", "result_rank0.json",
            "result_rank1.json"} <= names
    assert set(result.distributed.per_rank) == {"0", "1"}
    # global throughput is the sum over ranks: tokens of both ranks over the slowest rank's time
    with open(run / "steps.csv") as fh:
        steps = list(csv.DictReader(fh))
    with open(run / "steps_rank0.csv") as fh:
        rank0 = list(csv.DictReader(fh))
    assert int(steps[-1]["tokens"]) == 2 * int(rank0[-1]["tokens"])
    steady = [s for s in steps if s["warmup"] == "False"]
    expected = sum(int(s["tokens"]) for s in steady) / sum(float(s["step_time_s"]) for s in steady)
    assert result.throughput.tokens_per_s == pytest.approx(expected)
    assert result.throughput.tokens_per_s_per_gpu == pytest.approx(result.throughput.tokens_per_s / 2)
    assert result.distributed.step_time_skew is not None and result.distributed.step_time_skew >= 0
    assert result.throughput.loss_last < result.throughput.loss_first
    with open(run / "steps_rank1.csv") as fh:
        rank1 = list(csv.DictReader(fh))
    # the run's loss is the global batch's (steps.csv), not rank 0's shard's
    assert result.throughput.loss_first == pytest.approx(float(steps[0]["loss"]))
    assert float(steps[0]["loss"]) != pytest.approx(float(rank1[0]["loss"]), abs=1e-7)


def test_aggregate_steps_takes_the_slowest_rank():
    a = [{"step": 1, "step_time_s": 0.5, "tokens": 10, "real_tokens": 9, "mem_allocated": 1, "mem_peak_allocated": 5,
          "mem_reserved": 2, "mem_peak_reserved": 6, "data_s": 0.01, "gc_s": 0.2, "compile_s": 0.0,
          "alloc_retries": 0}]
    b = [{"step": 1, "step_time_s": 0.7, "tokens": 10, "real_tokens": 8, "mem_allocated": 3, "mem_peak_allocated": 4,
          "mem_reserved": 2, "mem_peak_reserved": 9, "data_s": 0.02, "gc_s": 0.0, "compile_s": 0.0,
          "alloc_retries": 2}]
    (row,) = aggregate_steps([a, b])
    assert (row["step_time_s"], row["tokens"], row["real_tokens"], row["mem_peak_reserved"]) == (0.7, 20, 17, 9)
    # the rank held up on the host holds every rank up: each cause is the worst rank's
    assert (row["data_s"], row["gc_s"], row["alloc_retries"]) == (0.02, 0.2, 2)


def test_the_steps_loss_is_over_every_ranks_tokens():
    """Each rank's loss is its own shard's: the step's is their mean weighted by real tokens (rank 0's alone went
    6.2579 -> 6.2494 while rank 1's went 6.2687 -> 6.2533)."""
    base = {"step": 1, "step_time_s": 0.5, "tokens": 10, "mem_allocated": 1, "mem_peak_allocated": 1,
            "mem_reserved": 1, "mem_peak_reserved": 1, "data_s": 0.0, "gc_s": 0.0, "compile_s": 0.0,
            "alloc_retries": 0}
    (row,) = aggregate_steps([[{**base, "loss": 2.0, "real_tokens": 30}], [{**base, "loss": 4.0, "real_tokens": 10}]])
    assert row["loss"] == pytest.approx(2.5)
    (row,) = aggregate_steps([[{**base, "loss": 2.0, "real_tokens": 0}], [{**base, "loss": 4.0, "real_tokens": 0}]])
    assert row["loss"] == pytest.approx(3.0)


def test_torchrun_command_and_cli_round_trip():
    args = build_parser().parse_args(["train", "lora", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1",
                                      "--rdzv-endpoint", "host:29500", "--parallel", "ddp", "--batch-size", "3"])
    cfg = config_from_args(args)
    cmd = torchrun_command(cfg, "/runs/x/config.json")
    assert cmd[1:4] == ["-m", "ftprof.engine.torchrun_entry", "--nproc-per-node"]  # torchrun in our wrapper
    assert "host:29500" in cmd and cmd[cmd.index("--node-rank") + 1] == "1"
    assert cmd[-3:] == ["-m", "ftprof.engine.worker", "/runs/x/config.json"]  # workers load the config file
    # command.sh's spelling of the same config parses back to it
    again = config_from_args(build_parser().parse_args(["train", *cfg.cli_args()]))
    assert again == cfg


@pytest.mark.parametrize("argv, fragment", [
    (["--nnodes", "2"], "--nnodes > 1 needs --rdzv-endpoint"),
    (["--nproc-per-node", "0"], "--nproc-per-node must be at least 1"),
    (["--node-rank", "1"], "--node-rank 1 must be in [0, --nnodes)"),
    (["--nproc-per-node", "2", "--quant-storage", "uint8"], "qlora under FSDP needs a floating --quant-storage"),
    (["--nproc-per-node", "2", "--parallel", "ddp", "--fsdp-cpu-offload"], "--fsdp-cpu-offload applies to"),
    (["--nproc-per-node", "2", "--fsdp-cpu-offload"], "--fsdp-cpu-offload moves shards"),
])
def test_distributed_bad_input(tmp_path, capsys, argv, fragment):
    code = main(["train", "qlora", "--device", "cpu", "--output-dir", str(tmp_path), *argv])
    assert code == 2
    assert fragment in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
@requires_run("gptq-lora")
def test_gptq_lora_two_processes_quantize_once(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FTPROF_CACHE_DIR", str(cache))
    result = ftprof.train(tiny_config(tmp_path / "runs", "gptq-lora", nproc_per_node=2, parallel="ddp", max_steps=3,
                                      run_name="g", gptq_calibration_samples=4))
    assert result.status == "ok", result.failure.error_message
    entries = [p for p in (cache / "gptq").iterdir()]
    assert len(entries) == 1 and not entries[0].name.startswith(".")  # one checkpoint, no leftover temp dirs


@pytest.mark.slow  # > 4 s on the 2-core machine: `pytest -m 'not slow'` is the fast subset
def test_profile_every_rank_with_checkpointing_under_fsdp(tmp_path):
    cfg = tiny_config(tmp_path, "lora", nproc_per_node=2, parallel="fsdp", max_steps=4, run_name="p", profile=True,
                      prof_ranks="all", prof_active_steps=1, gradient_checkpointing=True)
    result = ftprof.train(cfg)
    assert result.status == "ok", result.failure.error_message
    prof = tmp_path / "p" / "profile" / "cycle1"  # one folder per cycle, one trace per rank
    traces = sorted(p.name for p in prof.iterdir())
    assert traces == ["trace_rank0_cycle1.pt.trace.json.gz", "trace_rank1_cycle1.pt.trace.json.gz"]
    import gzip

    ranks = {json.loads(gzip.open(prof / t).read())["distributedInfo"]["rank"] for t in traces}
    assert ranks == {0, 1}
    assert (prof.parent / "summary.md").exists() and result.flops.recompute_flops_per_token > 0  # beside the cycles
    summary = json.loads((prof.parent / "summary.json").read_text())
    recompute = next(d for d in summary["diagnoses"] if d["code"] == "recomputation")
    flops = result.flops
    expected = flops.recompute_flops_per_token / (flops.flops_per_token + flops.recompute_flops_per_token)
    assert recompute["evidence"]["flops_share"] == pytest.approx(expected)


def test_a_multi_node_launch_says_what_it_waits_for():
    from ftprof.engine.distributed import waiting_message

    args = build_parser().parse_args(["train", "lora", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1",
                                      "--rdzv-endpoint", "host:29500"])
    message = waiting_message(config_from_args(args))
    assert "node 1 of 2" in message and "host:29500" in message and "all 2 nodes" in message


@pytest.mark.slow
def test_qlora_under_fsdp_keeps_the_recomputed_weights_of_checkpointed_layers(tmp_path):
    """FSDP2 all-gathers each packed 4-bit weight without its quant state: the kept-weight route restores it from
    the module, as bitsandbytes' own forward does."""
    result = ftprof.train(tiny_config(tmp_path, "qlora", nproc_per_node=2, checkpointing="full", max_steps=3,
                                      measure_warmup_steps=1))
    assert result.status == "ok", result.failure.error_message
    assert result.run.world_size == 2
    assert result.checkpointing.kept_dequantized == 14  # 7 projections x 2 layers, each rank


def test_fsdp2_in_one_process_trains_as_the_plain_model(tmp_path):
    """--fsdp-cpu-offload on one GPU runs FSDP2 in the one process: a group of one, the wrap, a training step equal
    to the unwrapped model's, and no group left afterwards (here on CPU: gloo, without the offload policy, which
    needs a GPU)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from ftprof.engine import distributed
    from ftprof.models.materialize import build_random_model
    from ftprof.models.presets import preset_config
    from ftprof.ranks import DistInfo

    cpu = torch.device("cpu")
    offload = tiny_config(tmp_path, "full", fsdp_cpu_offload=True)
    assert distributed.shards(offload, DistInfo()) and not distributed.shards(tiny_config(tmp_path, "full"),
                                                                              DistInfo())
    assert not distributed.shards(tiny_config(tmp_path, "full", parallel="ddp"), DistInfo(world_size=2))

    def one_step(model):
        ids = torch.randint(3, 500, (2, 16), generator=torch.Generator().manual_seed(0))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = {n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                 for n, p in model.named_parameters()}
        return loss.item(), grads

    plain_loss, plain_grads = one_step(build_random_model(preset_config("tiny"), cpu, torch.float32, seed=0))
    model = build_random_model(preset_config("tiny"), cpu, torch.float32, seed=0)
    with distributed.single_process_group(cpu):
        assert dist.get_world_size() == 1
        wrapped = distributed.wrap(model, tiny_config(tmp_path, "full"), cpu, torch.float32)
        assert all(isinstance(p, DTensor) for p in wrapped.parameters())
        loss, grads = one_step(wrapped)
    assert not dist.is_initialized()
    assert loss == pytest.approx(plain_loss, rel=1e-6)
    assert grads.keys() == plain_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], **SAME_OPS, msg=name)


def test_one_node_without_an_endpoint_lets_torchrun_bind_its_own_port():
    """No port is picked here and bound later (a race between two runs started at once): torchrun's standalone
    rendezvous binds port 0 itself. A named endpoint and the static backend keep their own arguments."""
    one_node = config_from_args(build_parser().parse_args(["train", "lora", "--nproc-per-node", "2"]))
    cmd = torchrun_command(one_node, "c.json")
    assert "--standalone" in cmd and "--rdzv-endpoint" not in cmd
    named = config_from_args(build_parser().parse_args(["train", "lora", "--nproc-per-node", "2",
                                                        "--rdzv-endpoint", "127.0.0.1:29511"]))
    assert "--standalone" not in torchrun_command(named, "c.json")
    static = config_from_args(build_parser().parse_args(["train", "lora", "--nproc-per-node", "2",
                                                         "--rdzv-backend", "static"]))
    cmd = torchrun_command(static, "c.json")
    assert "--standalone" not in cmd and cmd[cmd.index("--rdzv-backend") + 1] == "static"
