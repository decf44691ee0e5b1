"""Exceptions that carry a one-line message for the user (no traceback)."""


class FtprofError(Exception):
    """Base class for errors ftprof reports to the user as one line."""


class ConfigError(FtprofError, ValueError):
    """Bad input: an option, a path, a combination. Raised before any expensive work."""
