import pytest

from ftprof.bench.sweep import load_sweep
from ftprof.errors import ConfigError


def _sweep(tmp_path, text, name="s.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_matrix_expansion_exclusion_and_extra_cells(tmp_path):
    sweep = load_sweep(_sweep(tmp_path, """
name: grid
base: {model: tiny, max_steps: 3}
matrix:
  method: [full, lora, qlora]
  batch_size: [1, 2]
experiments:
  - {method: lora, seq_len: 256}
exclude:
  - {method: full, batch_size: 2}
repeats: 2
"""))
    cells = {(e.values["method"], e.values.get("batch_size"), e.values.get("seq_len")) for e in sweep.experiments}
    assert cells == {("full", 1, None), ("lora", 1, None), ("lora", 2, None), ("qlora", 1, None),
                     ("qlora", 2, None), ("lora", None, 256)}
    assert len(sweep.experiments) == 12 and sweep.repeats == 2
    assert len({e.name for e in sweep.experiments}) == 12  # repeats get their own directories
    assert sweep.varying[0] == "method" and "batch_size" in sweep.varying
    assert all(e.config.model.model == "tiny" and e.config.train.max_steps == 3 for e in sweep.experiments)
    assert sweep.name == "grid" and sweep.memory_logging == "all"


def test_names_are_stable_across_loads(tmp_path):
    text = "matrix: {method: [full, lora], batch_size: [1, 2]}\nbase: {model: tiny}\n"
    a = [e.name for e in load_sweep(_sweep(tmp_path, text)).experiments]
    b = [e.name for e in load_sweep(_sweep(tmp_path, text)).experiments]
    assert a == b and a[0].startswith("method=full_batch_size=1-")


def test_a_name_keeps_an_exponent_s_sign(tmp_path):
    """1e+30 is not named 1e-30 (the cell that diverged would read as one whose lr was tiny)."""
    names = [e.name for e in load_sweep(_sweep(tmp_path, "matrix: {method: [full], lr: [1.0e+30, 1.0e-30]}\n")
                                        ).experiments]
    assert names[0].startswith("lr=1e+30-") and names[1].startswith("lr=1e-30-")


def test_memory_logging_env_override_and_alias(tmp_path, monkeypatch):
    path = _sweep(tmp_path, "memory_logging: nvidia\nmatrix: {method: [full]}\n")
    assert load_sweep(path).memory_logging == "nvml"
    monkeypatch.setenv("MEMORY_LOGGING", "huggingface")
    sweep = load_sweep(path)
    assert sweep.memory_logging == "torch" and sweep.experiments[0].config.output.memory_logging == "torch"



def test_cell_memory_logging_wins_over_the_sweep_and_reaches_the_command(tmp_path, monkeypatch):
    from ftprof.bench.runner import replay_command

    monkeypatch.delenv("MEMORY_LOGGING", raising=False)
    path = _sweep(tmp_path, "memory_logging: all\nbase: {model: tiny}\nmatrix: {memory_logging: [none, nvidia]}\n")
    sweep = load_sweep(path)
    modes = sorted(e.config.output.memory_logging for e in sweep.experiments)
    assert modes == ["none", "nvml"]
    for exp in sweep.experiments:
        cmd = replay_command(exp, tmp_path / exp.name)
        assert cmd.count("--memory-logging") == 1  # neither cell's mode is the default (torch)
        assert cmd[cmd.index("--memory-logging") + 1] == exp.config.output.memory_logging
    monkeypatch.setenv("MEMORY_LOGGING", "torch")
    assert {e.config.output.memory_logging for e in load_sweep(path).experiments} == {"torch"}

BAD_FILES = [
    ("matrix: [unclosed\n", "s.yaml: line 2: not valid YAML"),
    ("- just\n- a list\n", "must be a YAML mapping"),
    ("matrx: {method: [full]}\n", "s.yaml: matrx: unknown key (did you mean 'matrix'?)"),
    ("matrix: {method: [full], batch_sise: [1]}\n", "matrix.batch_sise: unknown option (did you mean 'batch_size'?)"),
    ("matrix: {method: full}\n", "matrix.method: must be a non-empty list of values"),
    ("matrix: {method: []}\n", "matrix.method: must be a non-empty list"),
    ("base: {batch_size: [1, 2]}\nmatrix: {method: [full]}\n", "base.batch_size: must be a single value"),
    ("matrix: {method: [full, dora]}\n", "matrix[method=dora]: method: 'dora' is not one of"),
    ("matrix: {method: [full], batch_size: [two]}\n", "option 'batch_size' must be int, got str ('two')"),
    ("matrix: {method: [full], model: [llama-9b]}\n", "'llama-9b' is not a preset"),
    ("matrix: {method: [full], model: [./nope]}\n", "'./nope' is not a directory"),
    ("matrix: {method: [lora], gptq_bits: [4]}\n", "--gptq-bits is a GPTQ option"),
    ("matrix: {method: [full]}\nexclude: [{method: full}]\n", "the sweep has no experiments"),
    ("base: {model: tiny}\n", "the sweep has no experiments"),
    ("matrix: {method: [full]}\nexclude: [{batch_size: 1}]\n", "exclude[0].batch_size: is not a matrix key"),
    ("matrix: {method: [full]}\nrepeats: 0\n", "repeats: must be at least 1"),
    ("matrix: {method: [full]}\nrepeats: two\n", "repeats: must be a whole number, got str"),
    ("matrix: {method: [full]}\nrepeats: 2.5\n", "repeats: must be a whole number, got float"),
    ("matrix: {method: [full]}\ntimeout_s: soon\n", "timeout_s: must be a number, got str"),
    ("matrix: {method: [full]}\nname: [a]\n", "name: must be a string, got list"),
    ("matrix: {method: [full]}\ntimeout_s: -1\n", "timeout_s: must be positive"),
    ("matrix: {method: [full]}\nmemory_logging: everything\n", "memory_logging: 'everything' is not one of"),
    ("matrix: {method: [full]}\nbase: {output_dir: x}\n",
     "base.output_dir: is set by bench for each experiment (<output dir>/<experiment>); use ftprof bench --output-dir"),
    ("matrix: {method: [full]}\nname: a/b\n", "name: 'a/b' must be a plain directory name"),
    ("experiments: [{method: full}, {method: full}]\n", "experiments[1]: duplicates experiments[0]"),
    ("experiments: [{method: lora}, {method: lora, batch_size: 2}]\n",
     "experiments[1]: runs what experiments[0] runs (the options they differ in are at their defaults)"),
    # a rule that matches no cell is a typo, not a no-op
    ("matrix: {method: [full, lora], batch_size: [1, 2]}\n"
     "exclude: [{method: full, batch_size: 1}, {method: qlora}]\n",
     "exclude[1].method: 'qlora' is not one of the matrix's values (full, lora), so this rule excludes nothing"),
    ("matrix: {method: [full], batch_size: [1, 2]}\nexclude: [{method: full, batch_size: 4}]\n",
     "exclude[0].batch_size: 4 is not one of the matrix's values (1, 2)"),
    ("name: ''\nmatrix: {method: [full]}\n", "name: is empty: give a plain directory name, or leave name out"),
]


@pytest.mark.parametrize("text, fragment", BAD_FILES)
def test_bad_sweep_files_are_one_line_errors(tmp_path, text, fragment):
    with pytest.raises(ConfigError) as info:
        load_sweep(_sweep(tmp_path, text))
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_sweep_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_sweep(tmp_path / "none.yaml")
    with pytest.raises(ConfigError) as info:
        load_sweep(tmp_path)
    assert str(info.value).startswith(f"'{tmp_path}' is a directory, not a sweep file")


@pytest.mark.slow  # (over 2 s: CI's tier)
def test_ten_thousand_cells_expand_in_about_ten_times_a_thousands_time(tmp_path):
    """Expansion is linear in cells (it was quadratic: 2,000 cells took minutes): ten times the cells take about ten
    times the CPU time of this process, not the hundred times a quadratic step would."""
    import time

    def grid(n):
        values = ", ".join(str(v) for v in range(1, 11))
        path = _sweep(tmp_path, "base: {model: tiny, max_steps: 12}\nmatrix:\n"
                      f"  batch_size: [{values}]\n  seq_len: [{', '.join(str(32 * v) for v in range(1, 11))}]\n"
                      f"  grad_accum: [{values}]\n"
                      f"  warmup_steps: [{', '.join(str(v - 1) for v in range(1, 11 if n == 10_000 else 2))}]\n",
                      name=f"s{n}.yaml")
        start = time.process_time()
        sweep = load_sweep(path)
        seconds = time.process_time() - start
        assert len(sweep.experiments) == n and len({e.name for e in sweep.experiments}) == n
        return sweep, seconds

    _, thousand = grid(1_000)
    sweep, ten_thousand = grid(10_000)
    assert set(sweep.varying) >= {"batch_size", "seq_len", "grad_accum", "warmup_steps"}
    assert ten_thousand < 35 * thousand, (thousand, ten_thousand)


@pytest.mark.parametrize("text, fragment", [
    ("base: {model: tiny}\nmatrix: {method: [full]}\nmatrix: {method: [lora]}\n",
     "line 3: key 'matrix' is given twice"),
    ("base: {model: tiny, seq_len: 32, seq_len: 64}\nmatrix: {method: [full]}\n", "key 'seq_len' is given twice"),
    ("matrix: {method: [full]}\ntimeout_s: .nan\n", "timeout_s: must be positive and finite"),
    ("matrix: {method: [full]}\ntimeout_s: .inf\n", "timeout_s: must be positive and finite"),
    ("matrix: {method: [full], lr: [.nan]}\n", "--lr must be a finite number"),
    ("base: {model: tiny}\nmatrix: {method: [full], seq_len: [64, 4096]}\n", "exceeds the 2048 positions"),
    ("matrix: {method: [full]}\nexperiments: [{dataset: nowhere.jsonl}]\n", "'nowhere.jsonl' does not exist"),
    ("matrix: {method: [lora], lora_targets: [[q_proj, qkv]]}\n", "'qkv' names no module"),
])
def test_checked_up_front(tmp_path, text, fragment):
    with pytest.raises(ConfigError) as err:
        load_sweep(_sweep(tmp_path, text))
    assert fragment in str(err.value)


@pytest.mark.parametrize("written, value", [("2e-4", 2e-4), ("5E-5", 5e-5), ("1.5e-3", 1.5e-3), ("+3e-4", 3e-4),
                                            ("1_0e-5", 1e-4), ("0.0002", 2e-4), (".5e-3", 5e-4)])
def test_numbers_as_people_write_them(tmp_path, written, value):
    sweep = load_sweep(_sweep(tmp_path, f"base: {{model: tiny}}\nmatrix: {{method: [lora], lr: [{written}]}}\n"))
    assert sweep.experiments[0].config.train.lr == pytest.approx(value)


def test_whole_numbers_written_as_floats_are_ints(tmp_path):
    sweep = load_sweep(_sweep(tmp_path, "base: {model: tiny, max_steps: 1e1, seed: 1_000}\nmatrix: {method: [lora]}\n"))
    train = sweep.experiments[0].config.train
    assert train.max_steps == 10 and isinstance(train.max_steps, int) and train.seed == 1000


@pytest.mark.parametrize("text, fragment", [
    ("matrix: {method: [full]}\nrepeats: 1000000000\n", "repeats: 1,000,000,000 is more than the 1,000"),
    ("matrix: {method: [full], seed: [" + ", ".join(map(str, range(400))) + "], lr: ["
     + ", ".join(f"{i + 1}e-5" for i in range(300)) + "]}\n", "matrix: 120,000 cells (1 x 400 x 300"),
    ("matrix: {method: [full], seed: [" + ", ".join(map(str, range(1000))) + "]}\nrepeats: 101\n",
     "1,000 cells x 101 repeats = 101,000 experiments: at most 100,000"),
])
def test_too_large_a_sweep_is_refused_before_it_expands(tmp_path, text, fragment, monkeypatch):
    from ftprof.bench import sweep

    made = []
    monkeypatch.setattr(sweep, "_cells", lambda *args: made.append(args) or [])  # the expansion: never reached
    with pytest.raises(ConfigError) as info:
        load_sweep(_sweep(tmp_path, text))
    assert fragment in str(info.value) and made == []


def test_a_ten_to_the_ten_cell_matrix_is_refused_at_once(tmp_path):
    """Ten lists of ten values through YAML aliases: 10^10 cells, refused from the lengths."""
    ten = "[" + ", ".join(str(i + 1) for i in range(10)) + "]"
    keys = ["seed", "batch_size", "seq_len", "grad_accum", "max_steps", "lora_r", "lora_alpha", "eval_batches",
            "gc_interval", "warmup_steps"]
    text = "matrix:\n" + "".join(f"  {k}: {ten}\n" for k in keys)
    with pytest.raises(ConfigError, match=r"10,000,000,000 cells"):
        load_sweep(_sweep(tmp_path, text))


@pytest.mark.parametrize("text, fragment", [
    ("base: {method: lora, lora_targets: [[q_proj]]}\nmatrix: {seed: [1]}\n",
     "base.lora_targets: must be a list of names"),
    ("base: {method: lora, lora_targets: 5}\nmatrix: {seed: [1]}\n", "base.lora_targets: must be a list of names"),
    ("base: {method: lora, lora_targets: {q: 1}}\nmatrix: {seed: [1]}\n", "base.lora_targets: must be a single"),
    ("matrix: {method: [lora], lora_targets: [[[q_proj]]]}\n", "matrix.lora_targets[0]: must be a list of names"),
    ("matrix: {method: [lora], lora_targets: [3]}\n", "matrix.lora_targets[0]: must be a list of names"),
    ("matrix: {method: [lora], lora_targets: [[]]}\n", "matrix.lora_targets[0]: must be a list of names"),
    ("matrix: {batch_size: [{a: 1}]}\n", "matrix.batch_size[0]: must be a single value, got a dict"),
    ("matrix: {batch_size: [[1, 2]]}\n", "matrix.batch_size[0]: must be a single value, got a list"),
    ("experiments: [{seq_len: [1]}]\n", "experiments[0].seq_len: must be a single value"),
    ("experiments: [5]\n", "experiments[0]: must be a mapping"),
    ("matrix: {seed: [1]}\nexclude: [abc]\n", "exclude[0]: must be a mapping"),
    ("matrix: {seed: [1, 2]}\nexclude: [{seed: [1]}]\n", "exclude[0].seed: must be a single value"),
    ("base: {[a]: 1}\n", "line 1: not valid YAML: found unhashable key"),
    ("base: {report_to: [5]}\nmatrix: {seed: [1]}\n", "base.report_to: must be a list of names"),
    ("name: '.'\nmatrix: {seed: [1]}\n", "name: '.' must be a plain directory name"),
    ("name: '..'\nmatrix: {seed: [1]}\n", "name: '..' must be a plain directory name"),
    ("base: [1]\n", "base: must be a mapping, got list"),
    ("matrix: {seed: [1]}\nlauncher: [slurm]\n", "launcher: must be a mapping, got list"),
])
def test_every_wrong_shape_is_one_line_naming_the_place(tmp_path, text, fragment):
    with pytest.raises(ConfigError) as info:
        load_sweep(_sweep(tmp_path, text))
    assert str(info.value).startswith("s.yaml: ") and fragment in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_a_sweep_takes_the_spellings_a_config_file_takes(tmp_path):
    """learning_rate, per_device_train_batch_size, gradient_accumulation_steps and max-steps: what --config and the
    command line take (the HF Trainer's names), a sweep takes, in every section; one option spelled twice is
    refused."""
    sweep = load_sweep(_sweep(tmp_path, "schema_version: 2\nbase: {model: tiny, learning_rate: 0.001, "
                                        "per_device_train_batch_size: 4, max-steps: 3}\nmatrix: "
                                        "{gradient_accumulation_steps: [1, 2]}\nexclude: "
                                        "[{gradient_accumulation_steps: 2}]\n"))
    (exp,) = sweep.experiments
    assert (exp.config.train.lr, exp.config.data.batch_size, exp.config.train.max_steps) == (0.001, 4, 3)
    with pytest.raises(ConfigError, match="learning_rate and lr are one option"):
        load_sweep(_sweep(tmp_path, "base: {lr: 0.1, learning_rate: 0.001}\n"))


def test_a_sweep_without_schema_version_says_its_options_mean_version_1s(tmp_path, capsys):
    from ftprof.cli.main import main

    old = _sweep(tmp_path, "base: {model: tiny, max_steps: 2}\nmatrix: {method: [lora]}\n", "old.yaml")
    assert "constant learning rate" in load_sweep(old).old_meanings_note
    assert main(["bench", str(old), "--dry-run", "--output-dir", str(tmp_path / "o")]) == 0
    assert "old.yaml says no schema_version" in capsys.readouterr().out
    new = _sweep(tmp_path, "schema_version: 2\nbase: {model: tiny, max_steps: 2}\nmatrix: {method: [lora]}\n",
                 "new.yaml")
    assert load_sweep(new).old_meanings_note is None
    assert main(["bench", str(new), "--dry-run", "--output-dir", str(tmp_path / "n")]) == 0
    assert "schema_version" not in capsys.readouterr().out
