"""The distributed section: processes, nodes, rendezvous and FSDP2 / DDP."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ftprof.config.options import PARALLEL, RDZV_BACKENDS, check_types, one_of, option, require


@dataclass
class DistributedConfig:
    """Several GPUs or nodes: ftprof relaunches itself through torchrun (torch.distributed.run), or joins it."""

    nproc_per_node: int = option(1, "processes (GPUs) per node; above 1 ftprof relaunches itself under torchrun")
    nnodes: int = option(1, "nodes")
    node_rank: int = option(0, "this node's rank (multi-node)")
    rdzv_endpoint: Optional[str] = option(None, "rendezvous host:port (needed with --nnodes > 1)")
    rdzv_backend: str = option("c10d", "rendezvous backend", choices=RDZV_BACKENDS)
    parallel: str = option("fsdp", "data parallelism: FSDP2 (fully_shard, sharded) or DDP (replicated)",
                           choices=PARALLEL)
    fsdp_reshard_after_forward: bool = option(True, "FSDP: free gathered parameters after forward (less memory, "
                                              "one more all-gather in backward)")
    fsdp_cpu_offload: bool = option(False, "FSDP: keep sharded parameters, gradients and optimizer state on CPU "
                                    "(on one GPU too: FSDP2 then runs in the one process)")

    def __post_init__(self) -> None:
        check_types(self)
        require(self.nproc_per_node >= 1, f"--nproc-per-node must be at least 1, got {self.nproc_per_node}")
        require(self.nnodes >= 1, f"--nnodes must be at least 1, got {self.nnodes}")
        require(0 <= self.node_rank < self.nnodes, f"--node-rank {self.node_rank} must be in [0, --nnodes)")
        require(self.nnodes == 1 or bool(self.rdzv_endpoint), "--nnodes > 1 needs --rdzv-endpoint host:port")
        one_of("--parallel", self.parallel, PARALLEL)
        one_of("--rdzv-backend", self.rdzv_backend, RDZV_BACKENDS)
        require(not (self.fsdp_cpu_offload and self.parallel != "fsdp"),
                 "--fsdp-cpu-offload applies to --parallel fsdp only")
        if self.rdzv_endpoint is not None:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            require(bool(host) and port.isdigit() and 1 <= int(port) <= 65535,
                     f"--rdzv-endpoint '{self.rdzv_endpoint}' must be host:port, the port a number from 1 to 65535")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes
