"""The calibration store stays fast as it grows (issue 41): the planner reads the newest store.KEEP records of each
configuration, and the read that finds many superseded ones rewrites the store without them, so the next read parses
a fraction of the lines and the predictions are the same. Work is counted (records checked), not timed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from ftprof.plan import calibration, host, store
from ftprof.plan.calibration import ClassKey
from tests.plan.test_store import H200, record

CONFIGS = 40  # llama-1b LoRA at 40 micro-batch sizes


def grown(i: int, config: int, busy: float = 0.97) -> dict:
    """Run ``i`` of configuration ``config``: its rate varies run to run (the medians see which runs are kept)."""
    tokens = 512 * (config + 1)
    tps = 30_000.0 + (i * 7919) % 5000
    return record(i % 60, run_key=f"/runs/{config}-{i}", micro_batch_tokens=tokens, tokens_per_s=tps,
                  flops_per_s=7.8e9 * tps, gpu_busy=busy, training_peak=(20 + (i % 11)) * 2**30)


def write_store(path, runs_per_config: int) -> list[dict]:
    rows = [grown(i, i % CONFIGS, busy=0.5 if (i // CONFIGS) % 3 == 0 else 0.97)
            for i in range(runs_per_config * CONFIGS)]
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    return rows


def checks(monkeypatch) -> list[int]:
    """A counter of the records the store's reader checks."""
    count, real = [0], store.problem

    def counted(record):
        count[0] += 1
        return real(record)

    monkeypatch.setattr(store, "problem", counted)
    return count


def predictions(records: list[dict]) -> list:
    key = ClassKey("lora", "none", "eager", True)
    out = []
    for c in range(CONFIGS):
        tokens = 512 * (c + 1)
        out.append(calibration.speed_rate(H200, key, 7.8e9, tokens, records=records))
        out.append(calibration.activation_factor(key, records=records, at=calibration.Shape(
            "llama-1b", 2048, tokens)))
    out.append(host.host_floor(H200, key, 16, records))
    return out


@pytest.mark.slow
def test_a_grown_store_is_compacted_and_read_again_cheaply_with_the_same_predictions(tmp_path, monkeypatch):
    path = tmp_path / "calibration.jsonl"
    rows = write_store(path, 500)  # 20,000 records, 40 configurations
    size = path.stat().st_size
    count = checks(monkeypatch)
    first = calibration.load_records(path)
    parsed_first = count[0]
    count[0] = 0
    second = calibration.load_records(path)
    parsed_second = count[0]
    assert parsed_first == 20_000 and parsed_second == store.KEEP * CONFIGS * 2  # host-bound runs kept apart
    assert parsed_second * 10 < parsed_first and path.stat().st_size * 10 < size
    assert first == second
    # what is kept: the newest KEEP runs of each configuration (and host-bound or not), in store order
    by_config: dict = {}
    for r in rows:
        by_config.setdefault((r["micro_batch_tokens"], r["gpu_busy"]), []).append(r)
    newest = [r for r in rows if r in by_config[(r["micro_batch_tokens"], r["gpu_busy"])][-store.KEEP:]]
    assert [r["run_key"] for r in first] == [r["run_key"] for r in newest]
    assert predictions(first) == predictions(second) == predictions(newest)
    assert predictions(first)[0].runs == 2 * store.KEEP  # the newest of its host-bound runs and of the others


def test_a_store_of_few_runs_per_configuration_is_left_as_it_is(tmp_path):
    path = tmp_path / "calibration.jsonl"
    rows = write_store(path, store.KEEP // 3)  # fewer than KEEP of each configuration (host-bound or not)
    before = path.read_bytes()
    records = calibration.load_records(path)
    assert records == rows and path.read_bytes() == before
    assert predictions(records) == predictions(rows)


def test_below_the_threshold_nothing_is_rewritten_but_the_newest_answer(tmp_path):
    path = tmp_path / "calibration.jsonl"
    rows = [grown(i, 0) for i in range(store.KEEP + 10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = path.read_bytes()
    assert calibration.load_records(path) == rows[-store.KEEP:] and path.read_bytes() == before


def test_compaction_keeps_lines_it_does_not_believe_and_the_file_mode(tmp_path, capsys):
    path = tmp_path / "calibration.jsonl"
    write_store(path, 100)
    with path.open("ab") as f:
        f.write(b"not json\n" + json.dumps(record(1, knobs="x")).encode() + b"\n")
    path.chmod(0o640)
    calibration.load_records(path)
    lines = path.read_bytes().splitlines()
    assert len(lines) == store.KEEP * CONFIGS * 2 + 2 and lines[-2] == b"not json"
    assert path.stat().st_mode & 0o777 == 0o640
    assert "skipped 2 record(s)" in capsys.readouterr().err
    assert not list(tmp_path.glob(".calibration.jsonl.compact-*"))


@pytest.mark.slow
def test_appends_during_compactions_are_not_lost(tmp_path):
    """A writer that opened the store before a compaction renamed a new file over it appends to the new file."""
    path, go = tmp_path / "calibration.jsonl", tmp_path / "go"
    write_store(path, 60)  # 2,400 records: each read compacts once the writer has added superseded ones
    script = textwrap.dedent(f"""
        import os, sys, time
        from ftprof.plan.calibration import append_record
        from tests.plan.test_store_scale import grown
        while not os.path.exists({str(go)!r}):
            time.sleep(0.001)
        for i in range(1500):
            r = grown(i, i % 40)
            r["run_key"] = f"writer-{{i}}"
            append_record(r, {str(path)!r})
    """)
    writer = subprocess.Popen([sys.executable, "-c", script])
    go.touch()
    rewrites = 0
    while writer.poll() is None:
        before = path.stat().st_ino
        calibration.load_records(path)
        rewrites += path.stat().st_ino != before
    assert writer.wait(timeout=120) == 0
    keys = [json.loads(line)["run_key"] for line in path.read_text().splitlines()]
    written = [k for k in keys if k.startswith("writer-")]
    # every record the writer appended is there, or was superseded by KEEP newer of its configuration
    survivors = {f"writer-{i}" for i in range(1500) if i >= 1500 - store.KEEP * CONFIGS}
    assert survivors <= set(written), sorted(survivors - set(written))[:5]
    assert rewrites >= 1


@pytest.mark.parametrize("keep", [1, 5])
def test_newest_counts_per_configuration(keep):
    rows = [(i, grown(i, i % 3)) for i in range(30)]
    kept = store.newest(rows, keep)
    assert kept == {i for i in range(30) if i >= 30 - 3 * keep}
