"""The one vocabulary of run outcomes: each failure class with its exit status, display style and what a rerun does.

``ok`` is a finished run; ``oom_device`` a CUDA out-of-memory; ``oom_host`` out of host memory (an allocation that
failed, or a process the kernel's OOM killer took: SIGKILL with the kernel's OOM-kill count risen meanwhile, or
Slurm's ``OUT_OF_MEMORY``); ``killed`` a process killed by a signal nobody in ftprof sent and no evidence ties to the
OOM killer (the signal is named; resumable like ``interrupted``: the kill came from outside and says nothing about
the run, so a rerun of the sweep runs it again); ``timeout`` killed at its time limit; ``not_trained`` finished
its steps without training (a loss that was not finite, a gradient norm of 0 or not finite, no trainable weight
changed, a frozen one changed: ``ftprof.engine.proof``); ``interrupted`` stopped by Ctrl-C or SIGTERM (resumable:
a rerun of the sweep runs it again); ``error`` anything else, with the last lines of stderr.
"""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    OK = "ok"
    OOM_DEVICE = "oom_device"
    OOM_HOST = "oom_host"
    KILLED = "killed"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    ERROR = "error"
    NOT_TRAINED = "not_trained"

    @property
    def exit_code(self) -> int:
        """What `ftprof train`/`profile` exit with: 0 ok, 1 error (and ``killed``, which only bench records),
        3 out of memory, 4 timeout, 5 not trained, 130 interrupted."""
        return _EXIT[self]

    @property
    def style(self) -> str:
        """rich style for tables and progress lines."""
        return _STYLE[self]

    @property
    def failed(self) -> bool:
        """A failure: a sweep that records one exits 1. Kept by a rerun unless asked to retry (``--retry-failed``),
        except the :attr:`resumed` ones."""
        return self not in (Status.OK, Status.INTERRUPTED)

    @property
    def resumed(self) -> bool:
        """Run again by a plain rerun of the sweep (stopped from outside: nothing says the run itself fails):
        ``interrupted`` and ``killed``."""
        return self in (Status.INTERRUPTED, Status.KILLED)

    @classmethod
    def parse(cls, value: object) -> Status | None:
        """The status named by ``value`` (a string from a file), or None when it names none."""
        try:
            return cls(value)
        except ValueError:
            return None


_EXIT = {Status.OK: 0, Status.ERROR: 1, Status.OOM_DEVICE: 3, Status.OOM_HOST: 3, Status.KILLED: 1,
         Status.TIMEOUT: 4, Status.NOT_TRAINED: 5, Status.INTERRUPTED: 130}
_STYLE = {Status.OK: "green", Status.OOM_DEVICE: "red", Status.OOM_HOST: "red", Status.KILLED: "red",
          Status.TIMEOUT: "yellow", Status.INTERRUPTED: "yellow", Status.ERROR: "red", Status.NOT_TRAINED: "red"}

STATUSES = tuple(s.value for s in Status)
# A run directory with a config but no result yet: started and never finished (not a run status of its own).
INCOMPLETE = "incomplete"


def status_style(value: object) -> str:
    """Style for any status string a table shows, ``incomplete`` included."""
    status = Status.parse(value)
    return status.style if status else "yellow"


def exit_code(value: object) -> int:
    status = Status.parse(value)
    return status.exit_code if status else 1
