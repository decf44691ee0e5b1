"""ftprof report on run directories made for real in this session, plus hand-made failed and broken ones."""

import csv
import json
import shutil

import pytest

import ftprof
from ftprof.cli.main import main
from ftprof.report.tables import ci95, display_rows, summarize, to_markdown
from tests.conftest import tiny_config

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    runs = [("full", 2, "a"), ("full", 4, "b"), ("lora", 2, "c1"), ("lora", 2, "c2")]  # c1, c2: repeats
    for method, batch, name in runs:
        res = ftprof.train(tiny_config(root, method, batch_size=batch, max_steps=4, run_name=name))
        assert res.status == "ok"
    # a failed run, as bench records it: config plus a result with the failure class and peak
    failed = root / "oom"
    shutil.copytree(root / "a", failed)
    cfg = json.loads((failed / "config.json").read_text())
    cfg["data"]["batch_size"] = 512
    (failed / "config.json").write_text(json.dumps(cfg))
    result = json.loads((failed / "result.json").read_text())
    result.update(status="oom_device", tokens_per_s=None, batch_size=512, error_message="CUDA out of memory")
    (failed / "result.json").write_text(json.dumps(result))
    # broken ones: half-written and from a newer ftprof
    (root / "half").mkdir()
    (root / "half" / "config.json").write_text('{"model": {"mod')
    newer = root / "newer"
    shutil.copytree(root / "b", newer)
    cfg = json.loads((newer / "config.json").read_text())
    cfg["schema_version"] = 99
    (newer / "config.json").write_text(json.dumps(cfg))
    return root


def _result(root, name):
    return json.loads((root / name / "result.json").read_text())


def test_load_results_skips_broken_dirs(results):
    problems = []
    df = ftprof.load_results(results, problems=problems)
    assert sorted(df["run_name"]) == ["a", "b", "c1", "c2", "oom"]
    assert len(problems) == 2
    assert any("half" in p and "config.json: not valid JSON" in p for p in problems)
    assert any("newer" in p and "schema_version 99" in p for p in problems)


def test_report_tables_equal_the_inputs(results, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal: rich would otherwise fold the cells
    out = tmp_path / "rep"
    assert main(["report", str(results), "--output-dir", str(out)]) == 0
    captured = capsys.readouterr()
    assert "oom_device" in captured.out and "skipped" not in captured.out
    assert captured.err.count("skipped") == 2 and "schema_version 99" in captured.err
    with open(out / "summary.csv") as fh:
        rows = {(r["method"], r["batch_size"]): r for r in csv.DictReader(fh)}
    assert float(rows[("full", "4")]["tokens_per_s"]) == pytest.approx(_result(results, "b")["tokens_per_s"])
    assert float(rows[("full", "4")]["step_time_p50_s"]) == pytest.approx(_result(results, "b")["step_time_p50_s"])
    reps = [_result(results, n)["tokens_per_s"] for n in ("c1", "c2")]
    lora = rows[("lora", "2")]
    assert lora["repeats"] == "2"
    assert float(lora["tokens_per_s"]) == pytest.approx(sum(reps) / 2)
    assert float(lora["tokens_per_s_ci95"]) == pytest.approx(ci95(reps))
    assert rows[("full", "512")]["status"] == "oom_device"  # failed runs stay in the table
    md = (out / "summary.md").read_text()
    assert "All runs: model: tiny" in md  # constant columns lifted into a header line
    assert "**oom_device**" in md and "CUDA out of memory" in md
    with open(out / "raw_summary.csv") as fh:
        raw = list(csv.DictReader(fh))
    assert len(raw) == 5 and "memory_stages_mem_load_delta" in raw[0]


def test_training_peak_column_beside_the_overall_peak(results, tmp_path):
    """A run whose load peaked above training (an in-process quantization) shows both peaks."""
    run = tmp_path / "runs" / "q"
    shutil.copytree(results / "a", run)
    result = json.loads((run / "result.json").read_text())
    result.update(device="cuda", torch_peak_allocated=5 * 2**30, memory_breakdown={**result["memory_breakdown"],
                                                                     "training_peak": 3 * 2**30})
    (run / "result.json").write_text(json.dumps(result))
    headers, rows = display_rows(summarize(ftprof.load_results(run)))
    cells = dict(zip(headers, rows[0], strict=True))
    assert cells["peak alloc GiB"] == "5.00" and cells["training peak GiB"] == "3.00"
    assert "host peak RSS GiB" not in cells  # a GPU run: device memory is the figure


def test_cpu_runs_show_host_memory_and_hide_gpu_only_figures(results):
    table = summarize(ftprof.load_results(results, problems=[]))
    headers, rows = display_rows(table)
    assert table.cpu_only and "host peak RSS GiB" in headers
    assert not {"MFU %", "tokens/s/GPU", "peak alloc GiB", "peak reserved GiB"} & set(headers)
    assert "CPU runs: memory is the host RSS peak" in to_markdown(table)


def test_options_that_differ_between_rows_are_shown(results, tmp_path):
    for name, steps in (("x", 4), ("y", 8)):
        run = tmp_path / "runs" / name
        shutil.copytree(results / "a", run)
        cfg = json.loads((run / "config.json").read_text())
        cfg["train"]["max_steps"] = steps
        (run / "config.json").write_text(json.dumps(cfg))
    headers, rows = display_rows(summarize(ftprof.load_results(tmp_path / "runs")))
    assert "max_steps" in headers
    assert sorted(r[headers.index("max_steps")] for r in rows) == ["4", "8"]


def test_one_number_format():
    from ftprof.report.tables import _fmt

    assert _fmt(82.743, "num") == "82.7" and _fmt(4464.2, "num") == "4,464" and _fmt(3.14159, "num") == "3.14"
    assert _fmt(0.02171, "sec") == "0.022"


def test_memory_logging_separates_rows_only_when_it_varies(results, tmp_path):
    """An overhead sweep (same cell, different memory logging) gets a row per logging mode; elsewhere the mode is
    a header fact and does not split repeats."""
    def copy(name, mode):
        run = tmp_path / "runs" / name
        shutil.copytree(results / "a", run)
        cfg = json.loads((run / "config.json").read_text())
        cfg["output"]["memory_logging"] = mode
        (run / "config.json").write_text(json.dumps(cfg))
        return run

    runs = [copy("x1", "none"), copy("x2", "none"), copy("y", "all")]
    table = summarize(ftprof.load_results(tmp_path / "runs"))
    assert sorted(table.frame["memory_logging"]) == ["all", "none"]
    assert sorted(table.frame["repeats"]) == [1, 2]
    same = summarize(ftprof.load_results(runs[:2]))
    assert len(same.frame) == 1 and same.frame["repeats"][0] == 2


def test_plots_and_html(results, tmp_path):
    rep = ftprof.build_report([results], tmp_path / "rep")
    pngs = [p for n, p in rep.files.items() if n.endswith(".png")]
    assert {p.name for p in pngs} >= {"throughput_vs_memory.png", "tokens_vs_batch.png", "step_times.png",
                                      "pareto.png"}
    import matplotlib.image as mpimg

    for png in pngs:
        assert png.read_bytes()[:8] == PNG_MAGIC
        assert mpimg.imread(png).shape[0] > 100
    html = (tmp_path / "rep" / "report.html").read_text()
    # counted as <img> sources: the inlined plotly JavaScript holds the same data-URI prefix itself
    assert html.count("src='data:image/png;base64,") == len(pngs) and "<table>" in html and "oom_device" in html
    assert "Which should I pick?" in html and "Pareto frontier" in html
    assert "<figcaption>pareto.png</figcaption>" not in html and "Which configurations are worth it" in html
    # CPU runs: host memory, said so; the fastest configuration overall fits the largest budget
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert "host RSS peak" in md and "ran on the CPU" in md
    fastest = rep.choice.fastest
    assert rep.choice.picks[-1].choice == fastest and rep.choice.picks[-1].cost_pct == 0


@pytest.mark.slow  # (2.1 s on a 2-core machine: the working tier stays under 3 minutes)
def test_identical_baseline_passes_and_planted_regression_fails(results, tmp_path, capsys, monkeypatch):
    """End to end through the CLI (exit status 1 on a regression); the throughput noise model is in test_compare."""
    monkeypatch.setenv("COLUMNS", "200")
    current = tmp_path / "current"
    shutil.copytree(results, current)
    assert main(["report", str(current), "--baseline", str(results), "--output-dir", str(tmp_path / "r1")]) == 0
    assert "no regression beyond 5%" in capsys.readouterr().out
    res = json.loads((current / "b" / "result.json").read_text())
    for key in ("torch_peak_reserved", "host_peak_rss", "torch_peak_allocated"):
        res[key] = res[key] and int(res[key] * 1.2)  # the peak grew by 20%: not noise
    (current / "b" / "result.json").write_text(json.dumps(res))
    code = main(["report", str(current), "--baseline", str(results), "--threshold", "5", "--output-dir",
                 str(tmp_path / "r2")])
    out = capsys.readouterr().out
    assert code == 1
    assert out.count("regression") == 1 and "+20.0%" in out  # one line for the configuration
    assert "**regression**" in (tmp_path / "r2" / "summary.md").read_text()
    # within the threshold: not a regression
    assert main(["report", str(current), "--baseline", str(results), "--threshold", "25", "--output-dir",
                 str(tmp_path / "r3")]) == 0


def test_a_run_that_stopped_succeeding_is_a_regression(results, tmp_path):
    current = tmp_path / "current"
    shutil.copytree(results, current)
    res = json.loads((current / "a" / "result.json").read_text())
    res["status"] = "oom_device"
    (current / "a" / "result.json").write_text(json.dumps(res))
    rep = ftprof.build_report([current], tmp_path / "r", baseline=results)
    assert rep.comparison.failed
    assert any(r == "status ok -> oom_device" for c in rep.comparison.regressions for r in c.reasons)


def test_group_and_sort(results, tmp_path):
    rep = ftprof.build_report([results], tmp_path / "r", group_by="method", sort="tokens_per_s", formats="md")
    methods = list(rep.table.frame["method"])
    assert methods == sorted(methods)
    assert not (tmp_path / "r" / "summary.csv").exists() and (tmp_path / "r" / "summary.md").exists()


@pytest.mark.parametrize("argv, fragment", [
    (["report", "/no/such/results"], "does not exist"),
    (["report", "{results}", "--sort", "speed"], "--sort: 'speed' is not a column"),
    (["report", "{results}", "--group-by", "colour"], "--group-by: 'colour' is not a column"),
    (["report", "{empty}"], "no run directories"),
    (["report", "{results}", "--report-to", "comet"], "--report-to: 'comet' is not one of"),
])
def test_report_errors(results, tmp_path, capsys, argv, fragment):
    (tmp_path / "empty").mkdir()
    argv = [a.format(results=results, empty=tmp_path / "empty") for a in argv]
    assert main(argv + ["--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless Chromium not installed")
def test_report_html_renders_in_headless_chromium(results, tmp_path):
    """A screenshot check: the self-contained report.html renders (tables and embedded plots) in a real browser."""
    import subprocess

    import matplotlib.image as mpimg

    ftprof.build_report([results], tmp_path / "rep")
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,3000",
                    f"--screenshot={shot}", (tmp_path / "rep" / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    image = mpimg.imread(shot)
    assert image.shape[:2] == (3000, 1400)
    # the page is not blank: text, tables and plots cover more than 2% of it (a blank page is 0)
    drawn = (image[..., :3].mean(axis=2) < 0.9).mean()
    assert drawn > 0.02


def test_the_runs_device_is_a_budget(results, tmp_path):
    """The GPU the runs came from (env.json) is a budget of its own, when the runs agree on one."""
    from ftprof.report.build import runs_device

    runs = tmp_path / "runs"
    for name in ("a", "b"):
        shutil.copytree(results / name, runs / name)
        env = json.loads((runs / name / "env.json").read_text())
        env["gpus"] = [{"index": 0, "name": "NVIDIA H200", "total_memory": 150_000_000_000}]
        (runs / name / "env.json").write_text(json.dumps(env))
    df = ftprof.load_results(runs)
    assert runs_device(df) == ("NVIDIA H200", 150e9)
    rep = ftprof.build_report([runs], tmp_path / "rep", formats="md")
    assert "NVIDIA H200 (139.7 GiB, the runs' device)" in (tmp_path / "rep" / "summary.md").read_text()
    env = json.loads((runs / "b" / "env.json").read_text())
    env["gpus"][0]["name"] = "NVIDIA A100"
    (runs / "b" / "env.json").write_text(json.dumps(env))
    assert runs_device(ftprof.load_results(runs)) is None and rep.choice.picks


def test_report_to_sends_the_summary_table_to_tensorboard(results, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sweep = tmp_path / "sweep"
    shutil.copytree(results / "a", sweep / "a")
    shutil.copytree(results / "b", sweep / "b")
    assert main(["report", str(sweep), "--report-to", "tensorboard", "--format", "csv"]) == 0
    acc = EventAccumulator(str(sweep / "tensorboard"))
    acc.Reload()
    assert any(tag.startswith("sweep/summary") for tag in acc.Tags()["tensors"])


def test_report_messages_about_what_could_not_be_read(results, tmp_path, capsys):
    """Only a damaged run: the message says it was skipped and why. Only unfinished runs: no --sort error. Skipped
    runs are listed in summary.md too. An output directory that is a file: one line, exit 2."""
    damaged = tmp_path / "damaged"
    shutil.copytree(results / "half", damaged / "half")
    assert main(["report", str(damaged), "--output-dir", str(tmp_path / "o1")]) == 2
    err = capsys.readouterr().err
    assert "no readable run directory" in err and "1 skipped" in err and len(err.strip().splitlines()) == 1
    unfinished = tmp_path / "unfinished"
    shutil.copytree(results / "a", unfinished / "a")
    (unfinished / "a" / "result.json").unlink()
    assert main(["report", str(unfinished), "--format", "md", "--output-dir", str(tmp_path / "o2")]) == 0
    mixed = tmp_path / "mixed"
    shutil.copytree(results / "a", mixed / "a")
    shutil.copytree(results / "half", mixed / "half")
    assert main(["report", str(mixed), "--format", "md", "--output-dir", str(tmp_path / "o3")]) == 0
    assert "## Skipped run directories" in (tmp_path / "o3" / "summary.md").read_text()
    (tmp_path / "empty").mkdir()  # given beside a good one: named, not silently left out
    assert main(["report", str(mixed), str(tmp_path / "empty"), "--format", "md", "--output-dir",
                 str(tmp_path / "o4")]) == 0
    assert f"{tmp_path / 'empty'}: holds no run directory" in (tmp_path / "o4" / "summary.md").read_text()
    (tmp_path / "afile").write_text("x")
    capsys.readouterr()
    assert main(["report", str(mixed), "--output-dir", str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err
    assert "--output-dir: cannot write" in err and len(err.strip().splitlines()) == 1


def test_slow_steps_get_a_section_naming_run_step_and_cause(results, tmp_path):
    root = tmp_path / "runs"
    for name in ("a", "b"):
        shutil.copytree(results / name, root / name)
    quiet = _result(root, "a")
    quiet["slow_steps"] = []  # a real run on a busy machine can have a slow step: this copy has none
    (root / "a" / "result.json").write_text(json.dumps(quiet))
    result = _result(root, "b")
    result["slow_steps"] = [{"step": 7, "warmup": False, "step_time_s": 1.549, "extra_s": 0.563,
                             "cause": "torch.compile", "cause_s": 0.512}]
    (root / "b" / "result.json").write_text(json.dumps(result))
    assert main(["report", str(root), "--output-dir", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "summary.md").read_text()
    section = md[md.index("## Slow steps"):]
    assert "- b: step 7 took 1.549 s, 0.563 s over the steady median: torch.compile 0.512 s" in section
    assert "- a:" not in section  # run a had none
    assert "step 7 took 1.549 s" in (tmp_path / "rep" / "report.html").read_text()
    shutil.rmtree(root / "b")
    assert main(["report", str(root), "--output-dir", str(tmp_path / "rep2")]) == 0
    assert "Slow steps" not in (tmp_path / "rep2" / "summary.md").read_text()


def test_the_terminal_table_gives_the_throughputs_interval_and_no_empty_option_column(results):
    """Repeats (c1, c2) are a mean: in the terminal its tokens/s carries its 95% interval (the other columns' are in
    summary.md). An option that applies to no row (compile mode, nothing compiled) is no column of dashes."""
    from rich.console import Console

    from ftprof.cli.report import terminal_table
    from ftprof.report.tables import has_repeats

    table = summarize(ftprof.load_results(results, problems=[]))
    assert has_repeats(table)
    headers, rows = display_rows(table, with_ci={"tokens_per_s"})
    assert "compile mode" not in headers
    lora = next(r for r in rows if r[headers.index("method")] == "lora")
    assert " ± " in lora[headers.index("tokens/s")]
    assert all(" ± " not in cell for i, cell in enumerate(lora) if headers[i] != "tokens/s")
    console = Console(record=True, width=250)
    console.print(terminal_table(type("Report", (), {"table": table})()))
    assert "tokens/s is the mean ± 95% confidence interval" in console.export_text()
