"""The launcher: section of a sweep file and the --launcher options: validated, one line per problem."""

import pytest

from ftprof.bench.launcher import LauncherSettings, parse_launcher
from ftprof.bench.sweep import load_sweep
from ftprof.cli.main import main
from ftprof.errors import ConfigError

BASE = "base: {model: tiny, seq_len: 32, max_steps: 2, warmup_steps: 0, device: cpu}\nmatrix: {method: [full]}\n"


def _sweep(tmp_path, launcher: str):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + launcher)
    return path


def test_the_launcher_section_is_read(tmp_path):
    sweep = load_sweep(_sweep(tmp_path, "launcher: {type: slurm, partition: gpu, time: 90, mem: 200G, "
                                        "gpus_per_node: 8, max_jobs: 4, sbatch: ['--exclusive']}\n"))
    s = sweep.launcher
    assert (s.type, s.partition, s.time, s.mem, s.gpus_per_node, s.max_jobs, s.sbatch) == (
        "slurm", "gpu", "90", "200G", 8, 4, ("--exclusive",))


def test_no_section_means_local(tmp_path):
    assert load_sweep(_sweep(tmp_path, "")).launcher == LauncherSettings()


@pytest.mark.parametrize("section, message", [
    ("launcher: {partiton: gpu}", "s.yaml: launcher.partiton: unknown launcher setting (did you mean 'partition'?)"),
    ("launcher: {type: slrum}", "launcher.type: 'slrum' is not one of local, slurm (did you mean 'slurm'?)"),
    ("launcher: {time: soon}", "launcher.time: 'soon' is not a Slurm time limit"),
    ("launcher: {mem: lots}", "launcher.mem: 'lots' is not a Slurm memory size"),
    ("launcher: {nodes: 0}", "launcher.nodes: must be a whole number >= 1"),
    ("launcher: {sbatch: exclusive}", "launcher.sbatch: must be a list of sbatch options"),
    ("launcher: [slurm]", "s.yaml: launcher: must be a mapping"),
])
def test_a_bad_launcher_section_is_one_line(tmp_path, section, message):
    with pytest.raises(ConfigError) as exc:
        load_sweep(_sweep(tmp_path, section + "\n"))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_command_line_settings_win_over_the_file():
    settings = parse_launcher({"type": "slurm", "partition": "a", "time": "10"})
    merged = settings.merged({"partition": "b", "time": None, "max_jobs": 2})
    assert (merged.partition, merged.time, merged.max_jobs) == ("b", "10", 2)


def test_a_bad_command_line_setting_exits_2(tmp_path, capsys):
    code = main(["bench", str(_sweep(tmp_path, "")), "--launcher", "slurm", "--time", "soon", "--dry-run"])
    assert code == 2
    assert "time: 'soon' is not a Slurm time limit" in capsys.readouterr().err


def test_a_slurm_dry_run_says_where_the_jobs_go(tmp_path, capsys):
    """Not the local run's "CPU: one experiment at a time; timeout 1800 s": Slurm's partition and time limit."""
    code = main(["bench", str(_sweep(tmp_path, "")), "--launcher", "slurm", "--partition", "debug", "--time", "30",
                 "--dry-run", "--output-dir", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 0 and "Slurm: one job per experiment (partition debug, time limit 30)" in out
    assert "one experiment at a time" not in out
