"""torchrun inside a process ftprof owns: ``python -m ftprof.engine.torchrun_entry <torchrun arguments>``.

ftprof runs torchrun's own entry (``torch.distributed.run``) here instead of ``python -m torch.distributed.run``, so
that the ways torchrun ends become an exit status instead of its multi-line output: Ctrl-C (``SignalException``, a
traceback) and ranks that exited non-zero (``ChildFailedError``, a boxed report of every rank). The ranks record
their own outcome in the run directory, and the process that started us reads it back and says it in one line.

Why a wrapper and not a filter on torchrun's stderr: the ranks inherit torchrun's stderr, so a filter would have to
tell torchrun's lines from the ranks' by their text (which changes between torch versions), and would put a pipe
in front of every rank's output (the ranks would no longer see a terminal, and a filter that dies takes their
output with it). Exceptions are torchrun's API; their text is not.

Ctrl-C: torchrun turns SIGINT into an exception that aborts its wait for the ranks and then signals them again.
Here SIGINT is left out of the signals it handles (``--signals-to-handle``, or ``TORCHELASTIC_SIGNALS_TO_HANDLE``
in torch versions without that option): a Ctrl-C in a terminal reaches the ranks directly (one process group),
each records the run as interrupted and exits 130, and torchrun sees them end like any other exit (its log lines
about that are dropped). A SIGINT sent to this process alone is passed on to the ranks,
once. SIGTERM (bench stopping an experiment) keeps torchrun's own handling: it stops the ranks with a time limit.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

TORCHRUN_SIGNALS = "SIGTERM,SIGHUP,SIGQUIT"  # torchrun's default, less SIGINT (handled below)

STOP_GRACE_S = 30.0  # torchrun's own default wait for ranks to stop before SIGKILL (--shutdown-timeout)

_forwarded: list[bool] = []


def _forward_interrupt(signum, frame) -> None:
    """Pass SIGINT on to the ranks, once (a Ctrl-C in a terminal has reached them already; they ignore a repeat),
    and kill those still running ``STOP_GRACE_S`` later (a rank stuck in a collective whose peer has gone), as
    torchrun would. Before any rank has started, it stops torchrun itself."""
    if _forwarded:
        return
    _forwarded.append(True)
    import psutil

    ranks = psutil.Process().children()
    if not ranks:
        raise KeyboardInterrupt
    for rank in ranks:
        try:
            rank.send_signal(signal.SIGINT)
        except psutil.NoSuchProcess:
            pass
    timer = threading.Timer(STOP_GRACE_S, kill_still_running, args=(ranks,))
    timer.daemon = True
    timer.start()


def kill_still_running(ranks: list, grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGKILL the rank processes (and their children) that have not ended; one line each; returns their pids."""
    import psutil

    from ftprof.lifetime import kill_tree

    killed = []
    for rank in ranks:
        try:
            if not rank.is_running() or rank.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            continue
        print(f"ftprof: rank process {rank.pid} did not stop within {grace_s:.0f} s of Ctrl-C; killed it",
              file=sys.stderr, flush=True)
        kill_tree(rank)
        killed.append(rank.pid)
    return killed


class _QuietOnceInterrupted(logging.Filter):
    """After Ctrl-C, torchrun's log lines about ranks ending ("failed (exitcode: 130)", "Sending process ... closing
    signal") tell nothing the one line of ftprof does not."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _forwarded


def _quiet_torchrun_logs_once_interrupted() -> None:
    quiet = _QuietOnceInterrupted()
    for name in list(logging.root.manager.loggerDict):  # torchrun's modules are imported: their loggers exist
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).addFilter(quiet)


def exit_status(exitcode: int) -> int:
    """A process's exit status as a shell reports it: killed by signal N (negative in Python) is 128 + N."""
    return 128 - exitcode if exitcode < 0 else exitcode


def failed_ranks_status(exc) -> tuple[int, list[str]]:
    """From torchrun's ChildFailedError: the exit status of the rank that failed first, and one line for each
    rank that failed otherwise than by being interrupted (an interrupted rank has recorded that itself)."""
    from ftprof.results.status import Status

    _, first = exc.get_first_failure()
    interrupted = {Status.INTERRUPTED.exit_code, 128 + signal.SIGINT, 128 + signal.SIGTERM}
    lines = [f"ftprof: rank {rank} exited with status {exit_status(f.exitcode)}"
             for rank, f in sorted(exc.failures.items()) if exit_status(f.exitcode) not in interrupted]
    return exit_status(first.exitcode), lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = TORCHRUN_SIGNALS
    signal.signal(signal.SIGINT, _forward_interrupt)
    from ftprof.lifetime import die_with_parent

    die_with_parent(os.getppid())  # ftprof killed outright: SIGTERM, torchrun stops the ranks
    try:
        return run_torchrun(argv)
    except KeyboardInterrupt:  # before any rank started (torch still importing, say)
        return 130


def rendezvous_line(args, exc: BaseException) -> str:
    """One line for a rendezvous that failed: the endpoint, the nodes expected, and torchrun's reason (its first
    line; its traceback is dropped)."""
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return (f"ftprof: the rendezvous at {args.rdzv_endpoint} ({args.rdzv_backend}) did not gather all "
            f"{args.nnodes} nodes: {type(exc).__name__}{': ' + reason if reason != type(exc).__name__ else ''}")


def run_torchrun(argv: list[str]) -> int:
    """torchrun's main() without its @record decorator (which prints the failure box); its outcome as a status."""
    from torch.distributed import DistStoreError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import parse_args, run

    _quiet_torchrun_logs_once_interrupted()
    args = parse_args(argv)
    if hasattr(args, "signals_to_handle"):  # newer torchruns set the variable from this option
        args.signals_to_handle = TORCHRUN_SIGNALS
    try:
        run(args)
    except SignalException as exc:  # SIGTERM/SIGHUP/SIGQUIT: torchrun has stopped the ranks
        return 128 + int(exc.sigval)
    except (RendezvousError, DistStoreError) as exc:  # the other nodes never came, or the endpoint never answered
        print(rendezvous_line(args, exc), file=sys.stderr)
        return 1
    except ChildFailedError as exc:
        if _forwarded:  # Ctrl-C: the ranks recorded it (or were killed, and said so above)
            return 130
        status, lines = failed_ranks_status(exc)
        for line in lines:
            print(line, file=sys.stderr)
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
