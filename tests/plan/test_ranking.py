"""How ``ftprof plan`` ranks what fits: by predicted speed, except that rows within each other's error are a tie,
and a tie goes to the more confident prediction, then to the larger headroom; how sure each prediction is."""

from __future__ import annotations

import pytest

from ftprof.metrics import GIB
from ftprof.plan import speed
from ftprof.plan.calibration import Rate
from ftprof.plan.candidates import Candidate
from ftprof.plan.make import Row, _rank
from ftprof.results.parts import Prediction


def _row(name: int, tokens_per_s, band, headroom_gib, fits=True):
    cand = Candidate("qlora", "none", None, "eager", False, name, 1)
    pred = Prediction(peak_bytes=int((30 - headroom_gib) * GIB), tokens_per_s=tokens_per_s,
                      tokens_per_s_error=band, confidence=speed.confidence(band) if band is not None else "",
                      tokens_per_s_spread=band)
    return Row(cand, pred, fits, int(headroom_gib * GIB))


def _order(rows):
    return [r.candidate.batch_size for r in _rank(rows)]


def test_a_low_confidence_lead_inside_the_error_goes_below_a_confident_row():
    rows = [_row(1, 14_669, 0.30, 7.0), _row(2, 14_401, 0.05, 1.7), _row(3, 9_000, 0.05, 9.0)]
    ranked = _rank(rows)
    assert _order(rows) == [2, 1, 3]
    assert ranked[0].tie == "ranked above 1 less certain row(s) predicted faster, within its error"


def test_a_tie_of_equal_confidence_goes_to_the_larger_headroom():
    rows = [_row(1, 10_130, 0.05, 0.3), _row(2, 10_000, 0.05, 6.55)]  # a 1.3% lead with 0.3 GiB of headroom
    assert _order(rows) == [2, 1]
    assert _rank(rows)[0].tie == "tied with 1 other row as certain, within 3%: ranked first for its headroom"


def test_rows_apart_by_more_than_their_error_keep_the_speed_order():
    rows = [_row(1, 9_000, 0.03, 9.0), _row(2, 12_000, 0.03, 1.0)]
    assert _order(rows) == [2, 1] and not _rank(rows)[0].tie


def test_rows_without_a_speed_and_rows_over_the_budget_come_after():
    rows = [_row(1, None, None, 2.0), _row(2, 5_000, 0.05, 1.0), _row(3, None, None, -1.0, fits=False),
            _row(4, None, None, 5.0)]
    assert _order(rows) == [2, 4, 1, 3]


@pytest.mark.parametrize(("rate", "micro", "band", "word"), [
    (Rate(1e15, "", 3, 8192, "shipped"), 8192, 0.05, "high"),
    (Rate(1e15, "", 3, 8192, "local"), 8192, 0.03, "high"),
    (Rate(1e15, "", 3, 8192, "shipped"), 2048, 0.05 + 0.10 * 1.386, "low"),  # 4x smaller micro-batch
    (Rate(1e15, "", 3, 8192, "scaled"), 8192, 0.15, "medium"),
    (Rate(1e15, "", 3, 8192, "shipped", stand_in=True), 8192, 0.27, "low"),  # stand-ins erred up to 26.5%
    (Rate(1e15, "", 3, 8192, "shipped", knobs_matched=False), 8192, 0.10, "medium"),
])
def test_the_error_band_grows_with_the_distance_from_what_was_calibrated(rate, micro, band, word):
    assert speed.error_band(rate, micro) == pytest.approx(band, abs=1e-3)
    assert speed.confidence(speed.error_band(rate, micro)) == word


def test_an_error_every_row_shares_does_not_make_a_tie():
    """Rows planned for a GPU calibrated from another's peak share that scaling's error: it moves them together,
    so only their own spread can tie them."""
    scaled = Rate(1e15, "", 3, 8192, "scaled")
    assert speed.error_band(scaled, 8192) == pytest.approx(0.15) and speed.spread(scaled, 8192) == pytest.approx(0.03)
    a, b = _row(1, 12_000, 0.15, 1.0), _row(2, 11_000, 0.15, 9.0)
    a.prediction.tokens_per_s_spread = b.prediction.tokens_per_s_spread = 0.03
    assert _order([a, b]) == [1, 2]  # 9% apart: no tie once the shared part is left out


def test_equally_certain_rows_further_apart_than_a_near_tie_keep_the_speed_order():
    """Both within each other's 10% band, 5.7% apart: the faster goes first whatever the headroom (the plan's 24 GiB
    pick on an H200 went to the row with room to spare and ran 21% slower than the one it passed)."""
    rows = [_row(1, 14_260, 0.10, 10.2), _row(2, 15_075, 0.10, 0.96)]
    assert _order(rows) == [2, 1] and not _rank(rows)[0].tie


def _plan(rows, usable_gib=24.0, margin_gib=1.9):
    from ftprof.plan.make import Plan

    return Plan(request=None, target=None, usable_bytes=int(usable_gib * GIB), usable_from="--memory-limit-gib 24",
                margin_bytes=int(margin_gib * GIB), rows=rows)


def _peak_row(name: int, tokens_per_s, band, peak_gib, budget_gib=22.1):
    row = _row(name, tokens_per_s, band, budget_gib - peak_gib, fits=peak_gib <= budget_gib)
    row.prediction.peak_bytes = int(peak_gib * GIB)
    return row


def test_a_faster_row_left_out_by_the_margin_alone_is_named_with_its_command():
    """The user decides whether the margin is worth it: a row over the budget only by the margin, faster than the top
    row beyond its error, is named with the command that runs it; one over the card, or within the top's error,
    is not."""
    from ftprof.plan import output

    top, inside = _peak_row(1, 16_632, 0.05, 14.6), _peak_row(2, 18_788, 0.05, 22.7)
    note = output.margin_note(_plan([top, inside]), {"model": "llama-8b"})
    assert note.startswith("inside the margin: #2 is predicted 18,788 tokens/s (+13% over #1) at 22.7 GiB")
    assert note.endswith("ftprof train qlora --model llama-8b --batch-size 2")
    assert output.margin_note(_plan([top, _peak_row(2, 18_788, 0.05, 24.5)]), {}) is None  # over the card
    assert output.margin_note(_plan([top, _peak_row(2, 17_000, 0.05, 22.7)]), {}) is None  # within the error
    assert output.margin_note(_plan([_peak_row(2, 18_788, 0.05, 22.7)]), {}) is None  # nothing fits
