"""Plots on planted run rows: labels name what varies (and the repeat), the memory breakdown stacks the recorded
parts up to the recorded training peak, every series of tokens-vs-batch is drawn with integer ticks."""

import pandas as pd
import pytest

from ftprof.report import plots

GIB = 2**30


def _row(method, batch, ckpt=False, tps=1000.0, **extra):
    return {"status": "ok", "method": method, "model": "llama-1b", "batch_size": batch, "seq_len": 512,
            "gradient_checkpointing": ckpt, "world_size": 1, "tokens_per_s": tps, "run_dir": "/nowhere", **extra}


def test_labels_name_the_varying_options_and_the_repeat():
    df = pd.DataFrame([_row("lora", 4), _row("lora", 4), _row("full", 8, ckpt=True)])
    name = plots.labeller(df)
    assert [name(r) for _, r in df.iterrows()] == ["lora b4 no-ckpt #1", "lora b4 no-ckpt #2", "full b8 ckpt-full"]


def test_breakdown_uses_the_recorded_transients_against_the_training_peak():
    parts = {"weights_frozen": 2 * GIB, "weights_trainable": 0, "gradients": 0, "optimizer_state": 0,
             "activations_saved": 1 * GIB, "logits_gradients": 1 * GIB, "transients": 2 * GIB,
             "training_peak": 6 * GIB}
    row = _row("qlora", 4, torch_peak_allocated=10 * GIB, torch_peak_reserved=11 * GIB, non_torch_overhead=GIB,
               **{f"memory_breakdown_{k}": v for k, v in parts.items()})  # loading (quantizing) peaked at 10 GiB
    stacked = plots.breakdown_parts(pd.DataFrame([row]))
    training = [k for k in stacked if not k.startswith(("allocator", "non-torch"))]
    assert sum(stacked[k].iloc[0] for k in training) == 6 * GIB  # the training peak, not the overall 10
    assert stacked["transients (backward temporaries, recompute, dequantized weights)"].iloc[0] == 2 * GIB
    assert stacked["allocator reserve (run peak)"].iloc[0] == GIB


def test_tokens_vs_batch_draws_every_series_with_integer_ticks(tmp_path, monkeypatch):
    drawn = {}

    def keep(fig, path):
        drawn["ax"] = fig.axes[0]
        return path

    monkeypatch.setattr(plots, "save", keep)  # the PNG writer (figures.save)
    df = pd.DataFrame([_row("lora", 2, tps=500), _row("lora", 4, tps=900), _row("full", 4, tps=700)])
    plots.tokens_vs_batch(df, tmp_path)
    ax = drawn["ax"]
    lines = {line.get_label(): list(line.get_xdata()) for line in ax.get_lines()}
    assert set(lines) == {"lora", "full"} and lines["full"] == [4.0]  # one batch size: still a drawn point
    assert all(line.get_marker() not in (None, "None", "") for line in ax.get_lines())
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "4"]


@pytest.mark.parametrize("name", ["pareto.png", "memory_breakdown.png", "tokens_vs_batch.png"])
def test_every_plot_has_a_caption_that_is_a_question_or_answer(name):
    assert len(plots.CAPTIONS[name]) > 30
