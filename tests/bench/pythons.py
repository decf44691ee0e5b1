"""Stand-in interpreters for ``python:`` cells: one whose recipe dies at once, one that logs how it was called."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def crashing_python(tmp_path: Path) -> Path:
    """An interpreter whose recipe dies at once with a traceback on stderr (the probe bench runs still works)."""
    fake = tmp_path / "crashenv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = \"-c\" ]; then exec {shlex.quote(sys.executable)} \"$@\"; fi\n"
                    "echo 'loading the model' \n"
                    "echo 'Traceback (most recent call last):' >&2\n"
                    "echo '  File \"recipe.py\", line 1, in <module>' >&2\n"
                    "echo 'RuntimeError: the recipe fell over' >&2\nexit 1\n")
    fake.chmod(0o755)
    return fake


def logging_python(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter (bench's own, behind a script) that appends each call's arguments, one call a line, to the
    log it returns: the proof that a cell ran in its ``python:``."""
    log = tmp_path / "otherenv" / "calls.log"
    fake = tmp_path / "otherenv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\necho \"$*\" >>{shlex.quote(str(log))}\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    fake.chmod(0o755)
    return fake, log
