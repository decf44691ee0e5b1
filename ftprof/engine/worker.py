"""A child process's entry point: ``python -m ftprof.engine.worker CONFIG.json``.

Every process ftprof starts for a run (each torchrun worker, each bench experiment, each Slurm task) receives the
validated configuration as a file (the run's ``config.json``: it already records the resolved configuration) and
runs it here, exiting with the run's status code (``Status.exit_code``). The command-line spelling of a config
appears only in ``command.sh``, for people to read and replay.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from ftprof.errors import FtprofError
from ftprof.lifetime import StoppedBySignal, answer_ctrl_c, clear_stop, request_stop, stop_requested


def run_config_file(path: str) -> int:
    from ftprof.config import RunConfig
    from ftprof.engine.run import train
    from ftprof.results.status import exit_code
    from ftprof.results.store import read_json

    try:
        cfg = RunConfig.from_dict(read_json(path))
    except (OSError, ValueError) as exc:  # ConfigError is a ValueError too
        raise FtprofError(f"cannot load the run configuration {path}: {exc}") from None
    return exit_code(train(cfg).status)


def exit_worker(code: int) -> None:
    """A torchrun worker leaves without interpreter teardown: gloo's threads can abort it there (seen with torch
    2.14 on CPU: 'terminate called without an active exception') after every file is already written."""
    from ftprof.engine import distributed
    from ftprof.results.status import Status

    if code != Status.INTERRUPTED.exit_code:  # interrupted: a peer may be gone, its barrier would wait forever
        distributed.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _interrupt(signum, frame) -> None:
    """SIGTERM stops the run like Ctrl-C, once (torchrun and bench may both send it: a second one must not break the
    recording of the first), and reaches our own descendants first (torchrun's workers: torchrun itself is killed
    outright when the run stops, which would orphan them)."""
    if stop_requested():
        return
    request_stop()
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            child.send_signal(signum)
    except Exception:  # noqa: BLE001 - psutil missing or a child already gone: stopping matters more
        pass
    raise StoppedBySignal(signum)


@contextlib.contextmanager
def sigterm_stops_the_run():
    """For the duration, SIGTERM (timeout, scancel, docker stop, a batch system) stops the run as Ctrl-C does, as it
    does a bench worker's: recorded 'interrupted' with the steps it ran (its default action killed `ftprof train`
    without a result.json). The handler and the stop's record are put back after, for a process that goes on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        clear_stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m ftprof.engine.worker CONFIG.json", file=sys.stderr)
        return 2
    answer_ctrl_c()  # bench stops us with SIGINT, whatever our parent's parent left ignored or blocked
    signal.signal(signal.SIGTERM, _interrupt)  # bench stopping us (or dying: its parent-death signal) = Ctrl-C
    from ftprof.ranks import under_torchrun

    is_rank = under_torchrun()
    if is_rank:  # a rank: stop when torchrun is gone (killed outright, it cannot stop us itself)
        from ftprof.lifetime import die_with_parent

        die_with_parent(os.getppid())
        # Ctrl-C reaches a rank more than once (from the terminal, and passed on by the launcher): the first stops
        # the run, a repeat must not break the recording of the interrupted result.
        signal.signal(signal.SIGINT, _interrupt)
    try:
        code = run_config_file(argv[0])
    except FtprofError as exc:
        print(f"ftprof: error: {exc}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        if not is_rank:  # a rank stays quiet: the process that launched the ranks says it once for all of them
            print("ftprof: interrupted", file=sys.stderr)
        code = 130
    if is_rank:
        exit_worker(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
