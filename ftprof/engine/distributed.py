"""Several processes on PyTorch's own engine: torchrun launch, process group, FSDP2 / DDP wrapping, rank helpers.

ftprof relaunches itself through ``torch.distributed.run`` (torchrun) when a run asks for more than one process;
already under torchrun (RANK/WORLD_SIZE set), it joins. CUDA runs use NCCL, CPU runs gloo.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys

import torch
from torch import nn

from ftprof import metrics
from ftprof.config import RunConfig
from ftprof.lifetime import kill_tree
from ftprof.ranks import env_info, under_torchrun


def needs_launch(cfg: RunConfig) -> bool:
    return cfg.distributed.world_size > 1 and not under_torchrun()


def free_port() -> int:
    """A port free now (a test's endpoint); another process may take it before it is bound."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rendezvous_args(d) -> list[str]:
    """One node with no endpoint named: torchrun's ``--standalone`` rendezvous, whose store binds port 0 itself
    (a port picked here and bound by torchrun later could be taken in between: two runs started at once). A named
    endpoint, or the static backend (which has no port 0), is passed on as it is."""
    if d.nnodes == 1 and d.rdzv_endpoint is None and d.rdzv_backend == "c10d":
        return ["--standalone"]
    endpoint = d.rdzv_endpoint or f"127.0.0.1:{free_port()}"
    return ["--rdzv-backend", d.rdzv_backend, "--rdzv-endpoint", endpoint]


def torchrun_command(cfg: RunConfig, config_file: str) -> list[str]:
    """torchrun (in ftprof's wrapper: ``ftprof.engine.torchrun_entry``) over ``ftprof.engine.worker``: every
    worker loads the same config file."""
    d = cfg.distributed
    return [sys.executable, "-m", "ftprof.engine.torchrun_entry", "--nproc-per-node", str(d.nproc_per_node),
            "--nnodes", str(d.nnodes), "--node-rank", str(d.node_rank), *rendezvous_args(d),
            "-m", "ftprof.engine.worker", str(config_file)]


def waiting_message(cfg: RunConfig) -> str:
    d = cfg.distributed
    return (f"ftprof: node {d.node_rank} of {d.nnodes} ({d.nproc_per_node} processes) is waiting at the rendezvous "
            f"{d.rdzv_endpoint} until all {d.nnodes} nodes have started the same command")


def launch(cfg: RunConfig, config_file: str) -> int:
    """Run the same training under torchrun; returns its exit status (130 when interrupted).

    Ctrl-C in a terminal reaches every process of the group: the ranks record the run as interrupted and exit, and
    torchrun ends with them, so here we wait for it (``subprocess.run`` would kill it a quarter second later and
    orphan ranks still writing their results). A second Ctrl-C stops everything at once."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen(torchrun_command(cfg, config_file), env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        pass
    try:
        proc.send_signal(signal.SIGINT)  # in case only this process was interrupted; the ranks ignore a repeat
        proc.wait()
    except KeyboardInterrupt:
        kill_tree(proc.pid)
        proc.wait()
    return 130


def init(device_type: str):
    """Join the process group (once). The device must be chosen before NCCL initialises."""
    import torch.distributed as dist

    info = env_info()
    if not info.enabled or dist.is_initialized():
        return info
    if device_type == "cuda":
        torch.cuda.set_device(info.local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", info.local_rank))
    else:
        dist.init_process_group("gloo")
    return info


def shards(cfg: RunConfig, info) -> bool:
    """Whether FSDP2 wraps the model: with several processes under --parallel fsdp, and in one process for
    --fsdp-cpu-offload (the one GPU then holds a layer's parameters while it computes, the host the rest)."""
    return cfg.distributed.parallel == "fsdp" and (info.enabled or cfg.distributed.fsdp_cpu_offload)


@contextlib.contextmanager
def single_process_group(device: torch.device):
    """A process group of one for FSDP2 in a process torchrun did not start (its device mesh needs a group);
    nothing when a group exists. Destroyed on exit: the run makes no collective after its steps."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    cuda = device.type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=device if cuda else None)
    try:
        yield
    finally:
        dist.destroy_process_group()


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def wrap(model: nn.Module, cfg: RunConfig, device: torch.device, dtype: torch.dtype) -> nn.Module:
    d = cfg.distributed
    if d.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        from ftprof.models import fp8_base

        ids = [device.index] if device.type == "cuda" else None
        # DDP broadcasts every buffer from rank 0 before each forward: --fp8-base's e4m3 copies of the base weights
        # (13 GiB for llama-8b LoRA) would go over the wire every step, and gloo refuses their dtype. Every rank
        # made them from the same weights: DDP leaves them alone.
        DDP._set_params_and_buffers_to_ignore_for_model(model, fp8_base.buffer_names(model))
        # LoRA leaves most parameters frozen: DDP only reduces the trainable ones.
        return DDP(model, device_ids=ids, find_unused_parameters=False)
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype != torch.float32 else \
        MixedPrecisionPolicy()
    offload = CPUOffloadPolicy() if d.fsdp_cpu_offload else OffloadPolicy()
    kwargs = dict(mp_policy=mp, offload_policy=offload, reshard_after_forward=d.fsdp_reshard_after_forward)
    for layer in metrics.decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model
