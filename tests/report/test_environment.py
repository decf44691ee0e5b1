"""What a baseline comparison names as the machines' differences (env.json): library versions and ftprof's
environment switches, which change how a run computes without being options."""

from ftprof.report import environment


def _env(**switches):
    return {"torch_threads": 2, "packages": {"torch": "2.11.0"}, "switches": switches}


def test_a_switch_set_on_one_side_is_named():
    base = _env(FTPROF_LEAN_KERNELS=None, FTPROF_LOSS_CHUNK_TOKENS=None)
    cur = _env(FTPROF_LEAN_KERNELS=None, FTPROF_LOSS_CHUNK_TOKENS="0")
    assert environment.differences(base, cur) == ["FTPROF_LOSS_CHUNK_TOKENS unset → 0"]
    assert environment.differences(base, base) == []


def test_runs_that_recorded_no_switches_compare_on_the_rest():
    old = {"torch_threads": 2, "packages": {"torch": "2.10.0"}}
    assert environment.differences(old, _env(FTPROF_LOSS_CHUNK_TOKENS="0")) == ["torch 2.10.0 → 2.11.0"]
