"""Exceptions that carry a one-line message for the user (no traceback), and the one did-you-mean helper."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FtprofError(Exception):
    """Base class for errors ftprof reports to the user as one line."""


class StorageError(FtprofError, OSError):
    """A result file could not be written (disk full, quota, file size limit, read-only filesystem): not bad input,
    so the CLI exits 1 with this one line; files written before it stay."""


class ConfigError(FtprofError, ValueError):
    """Bad input: an option, a path, a combination. Raised before any expensive work."""


def did_you_mean(word: object, choices: Iterable[object]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or an empty string: appended to error messages."""
    hint = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f" (did you mean '{hint[0]}'?)" if hint else ""
