"""An option that applies to every row but is set in some only (--memory-limit-gib 8.5 beside no cap) tells the
runs apart in labels and in the report's table; an option that applies to some rows only (a LoRA rank beside a
full fine-tune) varies only when its set values do."""

import pandas as pd

from ftprof.report.tables import summarize
from ftprof.results.labels import labels, varying_options
from tests.results.test_effective import _row


def test_a_cap_beside_no_cap_is_a_varying_option():
    df = pd.DataFrame([_row(memory_limit_gib=None), _row(memory_limit_gib=8.5)])
    assert varying_options(df) == ["memory_limit_gib"]
    names = labels(df, repeats=False)
    assert names[0] != names[1] and "8.5" in names[1]
    assert "memory_limit_gib" in summarize(df).extra_keys


def test_an_option_unset_where_it_does_not_apply_does_not_vary():
    full = _row(method="full", lora_r=None, lora_alpha=None, quant_type=None)
    assert "lora_r" not in varying_options(pd.DataFrame([_row(), full]))
    assert "lora_r" in varying_options(pd.DataFrame([_row(), _row(lora_r=8), full]))
