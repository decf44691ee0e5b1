"""Processes that die with their parent: the Linux parent-death signal (prctl PR_SET_PDEATHSIG), through ctypes.

Bench sets it in each experiment it starts (a preexec_fn), and each torchrun worker sets it on itself, so killing
bench, even with kill -9, stops its experiments instead of orphaning them. Elsewhere than Linux it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1  # linux/prctl.h

_stop_requested: list[bool] = []


class StoppedBySignal(KeyboardInterrupt):
    """A signal (SIGTERM: timeout, scancel, docker stop; SIGHUP) stopping the run as Ctrl-C does, named in what the
    run records (a bare KeyboardInterrupt read as Ctrl-C)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


def request_stop() -> None:
    """This process was asked to stop (Ctrl-C, SIGTERM): what fails after it is the stop's doing."""
    _stop_requested.append(True)


def clear_stop() -> None:
    """The stop is over (an in-process run returned): what fails later is not its doing."""
    _stop_requested.clear()


def stop_requested() -> bool:
    """Whether this process was asked to stop. A rank of a distributed run that is stopped while its peer is
    inside a collective can see the peer's leaving first, as gloo's connection error: that run was interrupted,
    not broken."""
    return bool(_stop_requested)


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits; True if it could. If the parent is
    already gone (it died before this ran), the signal is sent now."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)
    return True


def preexec_die_with(parent_pid: int):
    """A ``subprocess.Popen(preexec_fn=...)`` that ties the child to ``parent_pid`` (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    return lambda: die_with_parent(parent_pid)


def kill_tree(process) -> None:
    """SIGKILL a process (a pid or a ``psutil.Process``) and its descendants, all found before any is killed, so
    that none escapes as an orphan. A process already gone is skipped."""
    import psutil

    try:
        parent = process if isinstance(process, psutil.Process) else psutil.Process(process)
        family = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        return
    for proc in family:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def answer_ctrl_c() -> None:
    """Make SIGINT raise KeyboardInterrupt in this process whatever its parent left: a process started with SIGINT
    ignored (a background job of a script, some test runners) or blocked in its signal mask inherits that, and
    bench, which stops its experiments with SIGINT, would never stop them (seen in CI: a bench and its experiment
    ran on for 18 minutes after Ctrl-C). Main thread only; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        return
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
