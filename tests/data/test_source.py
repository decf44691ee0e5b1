import subprocess
import sys

import pytest

from ftprof.config import DataConfig
from ftprof.data.source import check_dataset, load_rows, locate
from ftprof.errors import ConfigError
from tests.data_files import text_rows, write


@pytest.mark.parametrize("content, name, fragment", [
    (None, "missing.jsonl", "does not exist"),
    ("", "empty.jsonl", "is empty"),
    ("not json\n", "bad.jsonl", "line 1 is not JSON"),
    ('{"text": "a"}\n\n{"text": "b"}\n{"text": \n', "late.jsonl", "line 4 is not JSON"),
    ('{"text": "a"}\n[1]\n', "late_list.jsonl", "line 2 is not a JSON object"),
    ("[1, 2]\n", "list.jsonl", "line 1 is not a JSON object"),
    ("x", "data.xlsx", r"is not a supported file \(.txt, .json, .jsonl, .csv, .parquet\)"),
    (b"\xff\xfe\x00bad", "binary.txt", "cannot read"),
])
def test_bad_datasets(tmp_path, content, name, fragment):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=fragment):
        check_dataset(DataConfig(dataset=str(path)))


def test_locate_tells_files_folders_and_hub_names_apart(tmp_path):
    saved = write(tmp_path / "saved", text_rows(4))
    assert locate(DataConfig(dataset=saved)).kind == "disk"
    assert locate(DataConfig(dataset=write(tmp_path / "d.parquet", text_rows(4)))).kind == "file"
    assert locate(DataConfig(dataset="tatsu-lab/alpaca")).kind == "hub"
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConfigError, match="not written by datasets' save_to_disk"):
        locate(DataConfig(dataset=str(tmp_path / "plain")))
    with pytest.raises(ConfigError, match="is not 'synthetic', a data file"):
        locate(DataConfig(dataset="no such thing"))


def test_split_slicing_and_a_missing_split(tmp_path):
    path = write(tmp_path / "d.jsonl", text_rows(10))
    assert len(load_rows(DataConfig(dataset=path, dataset_split="train[:3]"))) == 3
    with pytest.raises(ConfigError, match="--dataset-split: .*test"):
        load_rows(DataConfig(dataset=path, dataset_split="test"))


def test_dataset_dict_folder_needs_an_existing_split(tmp_path):
    import datasets

    folder = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(text_rows(4)),
                          "validation": datasets.Dataset.from_list(text_rows(2))}).save_to_disk(str(folder))
    assert len(load_rows(DataConfig(dataset=str(folder), dataset_split="validation"))) == 2
    with pytest.raises(ConfigError, match="has no split 'valid' .*did you mean 'validation'"):
        load_rows(DataConfig(dataset=str(folder), dataset_split="valid"))


def test_save_to_disk_folders_take_a_slice_as_files_do(tmp_path):
    """datasets slices a split of a file or a hub dataset itself, not of a save_to_disk folder: ftprof does."""
    import datasets

    rows = datasets.Dataset.from_list(text_rows(10))
    datasets.DatasetDict({"train": rows, "validation": rows}).save_to_disk(str(tmp_path / "dd"))
    rows.save_to_disk(str(tmp_path / "single"))
    for folder in ("dd", "single"):
        where = str(tmp_path / folder)
        assert len(load_rows(DataConfig(dataset=where, dataset_split="train[:3]"))) == 3
        assert len(load_rows(DataConfig(dataset=where, dataset_split="train[50%:]"))) == 5
        assert len(load_rows(DataConfig(dataset=where, dataset_split="train[-2:]"))) == 2
    assert len(load_rows(DataConfig(dataset=str(tmp_path / "dd"), dataset_split="validation[:4]"))) == 4
    with pytest.raises(ConfigError, match="'train\\+validation' is not a split, or a split with one slice"):
        load_rows(DataConfig(dataset=str(tmp_path / "dd"), dataset_split="train+validation"))


def test_hub_dataset_offline_is_one_line_exit_2_before_torch(tmp_path):
    """No network and not in the local cache: one line naming the dataset, exit 2, before torch is imported."""
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": ".", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    code = ("import sys; from ftprof.cli.main import main; code = main(sys.argv[1:]); "
            "print('torch' in sys.modules); sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", code, "train", "lora", "--dataset", "nobody/no-such-dataset",
                           "--device", "cpu", "--output-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and proc.stdout.strip() == "False", (proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ftprof train: error: --dataset: hub dataset "
                                                   "'nobody/no-such-dataset' (split 'train') is not in the local")
    assert not (tmp_path / "runs").exists()  # nothing started


def test_a_hub_dataset_in_either_cache_is_left_to_the_load(tmp_path, monkeypatch):
    from ftprof.data.hub import dataset_maybe_cached

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    for var in ("HF_DATASETS_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    assert not dataset_maybe_cached("Org/Set")
    (tmp_path / "hub" / "datasets--Org--Set").mkdir(parents=True)
    assert dataset_maybe_cached("Org/Set") and not dataset_maybe_cached("Org/Other")
    (tmp_path / "datasets" / "org___other").mkdir(parents=True)  # datasets' own cache (its case may differ)
    assert dataset_maybe_cached("Org/Other")
