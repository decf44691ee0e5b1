"""Which rankings rest on one noisy run: configurations measured once whose steps varied widely (step p90/p50),
and about how many repeats would tell them from their neighbours in tokens/s."""

from __future__ import annotations

import math

# A single run whose step p90 is this many times its p50 is too unsteady to rank on its own.
NOISY_SPREAD = 1.5
MAX_REPEATS = 30
_Z90 = 1.2816  # a normal distribution's p90 lies this many standard deviations above its median
_T95 = 1.96


def noisy_singles(configs) -> list:
    """Configurations measured by one run whose step p90/p50 is at least ``NOISY_SPREAD``."""
    return [c for c in configs if c.repeats == 1 and c.spread is not None and c.spread >= NOISY_SPREAD]


def repeats_needed(config, configs) -> int:
    """Repeats that would bring the 95% interval of the configuration's tokens/s within half the gap to its
    nearest neighbour (at least 5%). The step spread stands in for the run-to-run spread: (p90/p50 - 1) / 1.28
    is the coefficient of variation of a normal distribution with that p90."""
    cv = max((config.spread or 1.0) - 1.0, 0.0) / _Z90
    others = [abs(o.tokens_per_s / config.tokens_per_s - 1) for o in configs
              if o is not config and config.tokens_per_s]
    gap = max(min(others, default=0.10), 0.05)
    n = math.ceil((_T95 * cv / (gap / 2)) ** 2)
    return max(3, min(n, MAX_REPEATS))


def to_markdown(configs) -> list[str]:
    """Lines for the "which should I pick?" section, or none when every ranking rests on steady data."""
    noisy = noisy_singles(configs)
    if not noisy:
        return []
    shown = "; ".join(f"{c.label} (p90/p50 {c.spread:.1f}, about {repeats_needed(c, configs)}"
                      f"{'+' if repeats_needed(c, configs) >= MAX_REPEATS else ''} repeats)" for c in noisy[:10])
    more = f"; {len(noisy) - 10} more" if len(noisy) > 10 else ""
    return [f"Noisy single runs: {len(noisy)} configuration(s) rest on one run whose steps varied widely (step "
            f"p90/p50 at least {NOISY_SPREAD:g}), so their place in the ranking is not settled: {shown}{more}. "
            "Repeats (the sweep's `repeats:`) give each a 95% interval; the counts are what would separate each "
            "from its nearest neighbour in tokens/s.", ""]
