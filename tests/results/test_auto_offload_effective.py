"""An auto run whose choice took --offload-checkpoints (result.json's checkpointing_auto.offload) shows the offload in
its effective configuration and its label; an auto run without it, or recorded before the field, reads as no
offload; a run whose auto never chose (it never started) says nothing about it."""

import pandas as pd

from ftprof.results.effective import config_key, effective, effective_frame
from ftprof.results.labels import labels
from tests.results.test_effective import _row


def _auto(offload=None, policy="full", **kw):
    row = _row(checkpointing="auto", offload_checkpoints=False, checkpointing_auto_policy=policy, **kw)
    if offload is not None:
        row["checkpointing_auto_offload"] = offload
    return row


def test_auto_s_offload_is_in_the_effective_configuration():
    assert effective(_auto(True))["offload_checkpoints"] is True
    assert effective(_auto(False))["offload_checkpoints"] is False
    assert effective(_auto())["offload_checkpoints"] is False  # a record from before the field: no offload
    assert effective(_auto(True, policy=None))["offload_checkpoints"] is None  # auto never chose
    assert effective(_row(checkpointing="none", offload_checkpoints=False))["offload_checkpoints"] is None
    assert effective(_row(checkpointing="full", offload_checkpoints=True))["offload_checkpoints"] is True


def test_auto_runs_with_and_without_the_offload_are_told_apart():
    df = pd.DataFrame([_auto(True), _auto(False), _auto()])
    keys = config_key(df)
    assert keys[0] != keys[1] and keys[1] == keys[2]
    names = labels(df, repeats=False)
    assert names[0] == "qlora offload" and names[1] == names[2] == "qlora no-offload"
    eff = effective_frame(pd.DataFrame([_auto(True), {k: v for k, v in _auto(False).items()
                                                      if k != "offload_checkpoints"}]))
    assert list(eff["offload_checkpoints"]) == [True, False]  # a row without the option's column
