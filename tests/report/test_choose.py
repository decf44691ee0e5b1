"""The "which should I pick?" logic on planted run rows: budgets, margin, frontier, option effects."""

import pandas as pd
import pytest

from ftprof.metrics import GIB, budget_margin
from ftprof.report.choose import choose, configurations, option_effects, pareto_front, to_markdown


def _row(method, batch, ckpt, tps, nvml_gib, reserved_gib=None, **extra):
    row = {"status": "ok", "method": method, "model": "llama-1b", "batch_size": batch, "seq_len": 1024,
           "gradient_checkpointing": ckpt, "world_size": 1, "nproc_per_node": 1, "nnodes": 1,
           "lora_r": None if method == "full" else 16, "tokens_per_s": tps,
           "nvml_process_used_peak": None if nvml_gib is None else nvml_gib * GIB,
           "torch_peak_reserved": (reserved_gib or (nvml_gib or 1) - 0.5) * GIB, "run_dir": "x"}
    row.update(extra)
    return row


@pytest.fixture
def sweep():
    return pd.DataFrame([
        _row("full", 4, False, 10_000, 70), _row("full", 4, True, 8_000, 40),
        _row("full", 8, True, 11_000, 60),
        _row("lora", 4, False, 12_000, 30), _row("lora", 4, True, 9_500, 15),
        _row("lora", 8, False, 13_000, 50), _row("lora", 8, True, 10_500, 20),
        _row("lora", 8, True, 10_700, 21),  # a repeat: tokens/s averaged, peak the max
        {**_row("full", 16, False, None, 139), "status": "oom_device"},  # failed: never chosen
    ])


def test_each_budget_gets_the_fastest_that_fits_with_the_margin(sweep):
    choice = choose(sweep, device=("NVIDIA H200", 141 * GIB))
    by_budget = {p.budget: p for p in choice.picks}
    assert by_budget["16 GiB"].choice is None  # 15 GiB > 16 less its margin
    assert by_budget["24 GiB"].choice.label == "lora b8 ckpt-full"  # 21 GiB (repeat max) <= 21.6
    assert by_budget["24 GiB"].choice.tokens_per_s == pytest.approx(10_600)
    assert by_budget["24 GiB"].choice.repeats == 2
    assert by_budget["40 GiB"].choice.label == "lora b4 no-ckpt"  # 30 GiB fits 36; full ckpt 40 GiB does not
    assert by_budget["80 GiB"].choice.label == "lora b8 no-ckpt"
    assert by_budget["80 GiB"].cost_pct == pytest.approx(0.0)
    assert by_budget["40 GiB"].cost_pct == pytest.approx(100 * (12_000 / 13_000 - 1))
    assert any("the runs' device" in p.budget for p in choice.picks)
    assert choice.memory_source == "NVML process peak"
    assert budget_margin(16 * GIB) == pytest.approx(0.08 * 16 * GIB, abs=1) and budget_margin(4 * GIB) == GIB


def test_torch_reserved_is_used_when_a_run_lacks_nvml(sweep):
    sweep.loc[0, "nvml_process_used_peak"] = None
    configs, words, on_gpu = configurations(sweep)
    assert words == "torch reserved peak" and on_gpu
    assert {c.label: c.peak_bytes / GIB for c in configs}["full b4 no-ckpt"] == pytest.approx(69.5)


def test_cpu_runs_say_host_memory():
    df = pd.DataFrame([{**_row("lora", b, False, 50.0 * b, None), "torch_peak_reserved": None,
                        "host_peak_rss": b * GIB} for b in (1, 2)])
    choice = choose(df)
    assert not choice.on_gpu and choice.memory_source == "host RSS peak"
    assert "ran on the CPU" in to_markdown(choice)


def test_pareto_front_keeps_only_undominated(sweep):
    front = [c.label for c in pareto_front(configurations(sweep)[0])]
    assert front == ["lora b4 ckpt-full", "lora b8 ckpt-full", "lora b4 no-ckpt", "lora b8 no-ckpt"]


def test_option_effects_compare_cells_that_differ_in_one_option(sweep):
    effects = {(e.option, str(e.before), str(e.after)): e for e in option_effects(configurations(sweep)[0])}
    ckpt = effects[("checkpointing", "none", "full")]
    # the policy comes from the recorded yes/no (runs older than --checkpointing)
    # pairs: full b4, lora b4, lora b8 (full b8 has no un-checkpointed cell)
    assert ckpt.pairs == 3
    assert ckpt.throughput_pct == pytest.approx(-20.0)  # median of -20 (full b4), -20.8 (lora b4), -18.5 (lora b8)
    assert ckpt.memory_bytes == pytest.approx(-29 * GIB)  # median of -30, -15, -29
    # method: lora_r (None for full) does not block the pairing
    method = effects[("method", "full", "lora")]
    assert method.pairs == 3 and method.throughput_pct > 0 and method.memory_bytes < 0
    batch = effects[("batch_size", "4", "8")]
    assert batch.pairs == 3


def test_checkpointing_policies_switch_in_their_own_order(sweep):
    sweep["checkpointing"] = sweep["gradient_checkpointing"].map({True: "full", False: "none"})
    sweep.loc[len(sweep)] = {**sweep.loc[3].to_dict(), "checkpointing": "selective", "tokens_per_s": 11_500.0,
                             "nvml_process_used_peak": 22 * GIB}  # lora b4 selective
    effects = [(e.option, e.before, e.after) for e in option_effects(configurations(sweep)[0])]
    assert ("checkpointing", "none", "selective") in effects and ("checkpointing", "full", "selective") in effects
    assert "lora b4 ckpt-selective" in {c.label for c in configurations(sweep)[0]}


def test_markdown_names_every_budget_and_the_frontier(sweep):
    md = to_markdown(choose(sweep))
    assert "## Which should I pick?" in md and "| 141 GiB | lora b8 no-ckpt | 13,000 |" in md
    assert "nothing measured fits" in md and "Pareto frontier" in md and "What each option bought" in md
    assert "checkpointing | no-ckpt → ckpt-full | 3 |" in md


def test_no_successful_run_says_so():
    df = pd.DataFrame([{**_row("full", 4, False, None, 70), "status": "oom_device"}])
    md = to_markdown(choose(df))
    assert "No successful run" in md


@pytest.mark.slow
def test_a_real_sweep_gets_a_choose_section_and_a_pareto_plot(tmp_path):
    """bench -> report end to end: three cells of the tiny preset (each its own process), then the report's
    choose section in summary.md and report.html, and the labelled frontier plot."""
    import ftprof
    from ftprof.cli.main import main

    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: s\nbase: {model: tiny, seq_len: 32, max_steps: 3, warmup_steps: 1}\n"
                     "matrix: {method: [full, lora], batch_size: [1, 2]}\nexclude: [{method: full, batch_size: 1}]\n"
                     "memory_logging: torch\n")
    outcomes = ftprof.run_sweep(sweep, tmp_path / "results")
    assert [o.status for o in outcomes] == ["ok"] * 3
    assert main(["report", str(tmp_path / "results"), "--output-dir", str(tmp_path / "report")]) == 0
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "## Which should I pick?" in summary and "| 16 GiB |" in summary and "What each option bought" in summary
    assert (tmp_path / "report" / "pareto.png").stat().st_size > 10_000
    assert "Which should I pick?" in (tmp_path / "report" / "report.html").read_text()


def test_runs_that_pad_differently_are_ranked_by_the_tokens_that_train():
    """A padded run counts its padding as tokens: 1,406 tokens/s of which 912 real, against a packed run's 957 of
    which 942. Ranked by tokens/s the padded one wins; it trains fewer tokens a second. Where every run pads alike
    (synthetic data), tokens/s ranks as before."""
    padded = _row("lora", 4, False, 1_406, 10, dataset="d.jsonl", packing=False, real_tokens_per_s=912)
    packed = _row("lora", 4, False, 957, 10, dataset="d.jsonl", packing=True, real_tokens_per_s=942)
    choice = choose(pd.DataFrame([padded, packed]))
    assert choice.throughput == "real tokens/s" and choice.fastest.label == "lora packing"
    assert {p.choice.label for p in choice.picks if p.choice} == {"lora packing"}  # 8 GiB: nothing fits 10
    assert "ranked by real tokens/s" in to_markdown(choice)
    alike = choose(pd.DataFrame([{**padded, "real_tokens_per_s": 1_395}, {**packed, "real_tokens_per_s": 950}]))
    assert alike.throughput == "tokens/s" and alike.fastest.tokens_per_s == 1_406
