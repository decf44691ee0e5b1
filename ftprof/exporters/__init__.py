"""Experiment trackers (``--report-to``): TensorBoard, Weights & Biases, MLflow.

Each exporter is one module with the same small protocol (``base.Tracker``): ``start(config)``,
``log_step(record)``, ``log_result(result)``, ``close()``. Its package is imported only when it is asked for;
``check_exporters`` (preflight) turns a missing one into one line before anything loads. ``Exporters`` fans out to
the chosen exporters on the main rank and does nothing elsewhere or when none is chosen. ``send_summary`` sends a
finished sweep's table (``ftprof report --report-to``).
"""

from ftprof.exporters.base import Exporters, check_exporters, send_summary

__all__ = ["Exporters", "check_exporters", "send_summary"]
