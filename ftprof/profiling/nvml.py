"""NVML sampler in its own process: device memory, the run's process-tree memory, utilization, power, energy, clock.

The training process starts it (``NvmlSampler``) with the UUIDs of the GPUs it uses, so the mapping from
CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER to NVML's own indices cannot go wrong. It writes nvml.csv:

    unix_s, gpu, name, memory_used, process_memory_used, utilization_gpu, power_w, energy_mj, sm_clock_mhz

(bytes for memory; energy is NVML's cumulative counter since driver load, in millijoules). Running in another
process keeps the sampling off the training loop: the training process pays nothing per sample.

    python -m ftprof.profiling.nvml --pid PID --uuids GPU-...,GPU-... --out nvml.csv [--interval 0.1]
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

COLUMNS = ["unix_s", "gpu", "name", "memory_used", "process_memory_used", "utilization_gpu", "power_w", "energy_mj",
           "sm_clock_mhz"]


def _tree_pids(root: int) -> set[int]:
    import psutil

    try:
        proc = psutil.Process(root)
        return {root} | {c.pid for c in proc.children(recursive=True)}
    except psutil.Error:
        return {root}


def _safe(fn, *args, default=None):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - a counter this GPU does not support stays empty
        return default


def _process_memory(pynvml, handle, pids: set[int]) -> int:
    total = 0
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        for p in _safe(getattr(pynvml, getter), handle, default=[]) or []:
            if p.pid in pids and p.usedGpuMemory:
                total += p.usedGpuMemory
    return total


def sample(pid: int, uuids: list[str], out: Path, interval: float) -> None:
    import pynvml

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByUUID(u) for u in uuids]
    names = [pynvml.nvmlDeviceGetName(h) for h in handles]
    names = [n.decode() if isinstance(n, bytes) else n for n in names]
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the run; the run stops us
    t0 = time.monotonic()
    with open(out, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        last_flush = t0
        while not stop["now"]:
            pids = _tree_pids(pid)
            now = time.time()
            for i, h in enumerate(handles):
                mem = _safe(pynvml.nvmlDeviceGetMemoryInfo, h)
                util = _safe(pynvml.nvmlDeviceGetUtilizationRates, h)
                power = _safe(pynvml.nvmlDeviceGetPowerUsage, h)
                writer.writerow([f"{now:.3f}", i, names[i], mem.used if mem else "",
                                 _process_memory(pynvml, h, pids), util.gpu if util else "",
                                 f"{power / 1000:.1f}" if power is not None else "",
                                 _safe(pynvml.nvmlDeviceGetTotalEnergyConsumption, h, default=""),
                                 _safe(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM, default="")])
            if time.monotonic() - last_flush > 1.0:
                fh.flush()
                last_flush = time.monotonic()
            if not _alive(pid):
                break
            time.sleep(interval)
    pynvml.nvmlShutdown()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


class NvmlSampler:
    """Starts the sampler process for this process's GPUs; ``stop()`` ends it and returns the summary."""

    def __init__(self, out: Path, device_uuids: list[str], interval: float = 0.1):
        self.out = Path(out)
        self.uuids = device_uuids
        self.interval = interval
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "ftprof.profiling.nvml", "--pid", str(os.getpid()), "--uuids",
               ",".join(self.uuids), "--out", str(self.out), "--interval", str(self.interval)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)

    def stop(self, window: tuple[float, float] | None = None) -> dict:
        if self.proc is None:
            return {}
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        self.proc = None
        summary = summarize_csv(self.out, window)
        if not summary and err:
            summary["error"] = err.decode(errors="replace").strip().splitlines()[-1][:300]
        return summary


def summarize_csv(path: Path, window: tuple[float, float] | None = None) -> dict:
    """Peak and mean memory per device, process-tree peak, mean power and utilization over the whole run; energy
    in joules over ``window`` (unix seconds: the steady-state steps) when given, else over the whole run."""
    if not Path(path).is_file():
        return {}
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        return {}
    out: dict = {"samples": len(rows)}
    per_gpu: dict[str, list[dict]] = {}
    for r in rows:
        per_gpu.setdefault(r["gpu"], []).append(r)

    def nums(rs, key):
        return [float(r[key]) for r in rs if r.get(key) not in ("", None)]

    peaks, procs, energy = [], [], None
    for gpu, rs in per_gpu.items():
        used, proc = nums(rs, "memory_used"), nums(rs, "process_memory_used")
        if used:
            out[f"gpu{gpu}_used_peak"] = int(max(used))
            out[f"gpu{gpu}_used_mean"] = int(sum(used) / len(used))
            peaks.append(max(used))
        if proc:
            procs.append(max(proc))
        inside = [r for r in rs if window is None or window[0] <= float(r["unix_s"]) <= window[1]]
        e = nums(inside, "energy_mj")
        if len(e) >= 2:
            out[f"gpu{gpu}_energy_j"] = (e[-1] - e[0]) / 1000.0
            energy = (energy or 0.0) + (e[-1] - e[0]) / 1000.0
        power, util = nums(inside or rs, "power_w"), nums(inside or rs, "utilization_gpu")
        if power:
            out[f"gpu{gpu}_power_mean_w"] = sum(power) / len(power)
        if util:
            out[f"gpu{gpu}_util_mean"] = sum(util) / len(util)
    if peaks:
        out["device_used_peak"] = int(max(peaks))
    if procs:
        out["process_used_peak"] = int(max(procs))
    if energy is not None:
        out["energy_j"] = energy
        if window is not None:
            out["energy_window_s"] = window[1] - window[0]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--uuids", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--interval", type=float, default=0.1)
    a = p.parse_args(argv)
    sample(a.pid, [u for u in a.uuids.split(",") if u], a.out, a.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
