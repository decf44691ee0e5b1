"""How ``pytest -n N --dist loadfile`` shares the suite among its workers (tests/conftest.py installs both).

Heavy files first. xdist hands out whole files, each to the next worker with little left to do, in order of their
number of tests, most first; the files of one or two long tests (a sweep of subprocesses, a Slurm time limit) then
come last, and one worker ran the last of them while the other sat idle. Here the files below go first, longest
first (the durations of the CI log they were read from, rounded), and the rest follow in xdist's own order. A file
missing from the list is only scheduled less well; a file that no longer exists is ignored. test_slurm_peers.py is
left out on purpose: kept at the end, its jobs never wait for the single-node Slurm's CPUs while test_slurm.py's
job sits out its one-minute time limit on one of them.

One share of the cores per worker. Each torch process takes every core for its intra-op threads: two workers on two
cores ran four spinning threads: tests/engine/test_train.py and test_resume.py under ``-n 2`` took 124 s of CPU with
two threads a worker, 65 s with one (tests/integrations/conftest.py saw one step's time swing tenfold for the same
reason).
"""

from __future__ import annotations

import os

# file -> seconds in CI (2 workers on 2 cores; the last CI log, less what later commits measured off them): the
# files whose few long tests would otherwise be scheduled last
HEAVY_FILES = {
    "tests/bench/test_slurm.py": 110,
    "tests/engine/test_distributed.py": 100,
    "tests/bench/test_runner_signals.py": 95,
    "tests/bench/test_runner.py": 65,
    "tests/benchmarks/test_hf_baseline.py": 45,
    "tests/models/test_lean_activations.py": 45,
    "tests/plan/test_plan_cli.py": 35,
    "tests/bench/test_peers_run.py": 31,
    "tests/engine/test_save_distributed.py": 31,
    "tests/models/test_dequant.py": 30,
    "tests/report/test_choose.py": 30,
    "tests/bench/test_autotune.py": 25,
    "tests/engine/test_torchrun_entry.py": 25,
    "tests/benchmarks/test_plan_holdout.py": 15,
}


def share_cores() -> int | None:
    """Under xdist: each worker's share of the cores as its torch threads (and its children's, through
    OMP_NUM_THREADS), unless OMP_NUM_THREADS says otherwise. Returns the threads set, or None."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if workers < 2 or os.environ.get("OMP_NUM_THREADS"):
        return None
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    return threads


def heavy_first(files: list[str]) -> list[str]:
    """Files (xdist's scopes, in its order: most tests first) with the heavy ones moved ahead, longest first."""
    return sorted(files, key=lambda f: -HEAVY_FILES.get(f, 0))  # stable: the rest keep xdist's order


def make_scheduler(config, log):
    """xdist's loadfile scheduling, its queue of files in heavy-first order; None (xdist's own) for any other
    --dist."""
    try:
        from xdist.scheduler import LoadFileScheduling
    except ImportError:
        return None
    if config.getvalue("dist") != "loadfile":
        return None

    class HeavyFirst(LoadFileScheduling):
        ordered = False

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first assignment: the queue is complete, nothing handed out yet
                self.ordered = True
                queue = getattr(self, "workqueue", None)  # xdist's internals (3.5-3.8): another version keeps its order
                if hasattr(queue, "move_to_end"):
                    for scope in heavy_first(list(queue)):
                        queue.move_to_end(scope)
            super()._assign_work_unit(node)

    return HeavyFirst(config, log)
