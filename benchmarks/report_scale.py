"""`ftprof report` over many runs: the wall time of `build_report` on synthetic run directories of distinct
configurations (tests/report/synthetic_runs.py: config.json, env.json, result.json and a 20-step steps.csv each),
for each run count and output format, against the target of 1,000 runs in under 10 s (`--format all`).

    python benchmarks/report_scale.py                 # 100 and 1,000 runs; prints a Markdown table
    python benchmarks/report_scale.py 1000 10000      # the run counts to measure

This was a unit test's threshold (tests/report/test_readable.py), which failed whenever the machine was busy; the
test now checks the report stays about linear in the runs (a ratio of two timings), and the speed is measured here.
Exits 1 when `--format all` over 1,000 runs (if measured) takes 10 s or more.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = {1000: 10.0}  # run count -> seconds for --format all


def measure(counts: list[int]) -> dict[tuple[int, str], float]:
    sys.path.insert(0, str(ROOT))
    from ftprof.report.build import build_report
    from tests.report.synthetic_runs import make_runs

    seconds = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            runs = make_runs(Path(tmp) / f"runs{n}", n)
            for formats in ("csv", "all"):
                start = time.perf_counter()
                build_report([runs], Path(tmp) / f"report{n}-{formats}", formats=formats)
                seconds[n, formats] = time.perf_counter() - start
    return seconds


def main(argv: list[str]) -> int:
    counts = [int(a) for a in argv] or [100, 1000]
    seconds = measure(counts)
    print("| runs | `--format csv` | `--format all` (tables, PNGs, report.html) |")
    print("| ---: | ---: | ---: |")
    for n in counts:
        print(f"| {n:,} | {seconds[n, 'csv']:.1f} s | {seconds[n, 'all']:.1f} s |")
    slow = [n for n, target in TARGET_S.items() if n in counts and seconds[n, "all"] >= target]
    for n in slow:
        print(f"{n:,} runs took {seconds[n, 'all']:.1f} s (--format all): the target is under {TARGET_S[n]:.0f} s")
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
