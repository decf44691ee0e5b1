"""Imports flow one way: the core never imports the CLI; models never import engine; bench never imports engine
or cli; report and results never import engine or models; the offline trace analysis (ftprof.analysis) imports
nothing of the training side (capture, engine, models) and capture (ftprof.profiling) nothing of the analysis.
Checked by parsing every module (lazy imports inside functions count too)."""

import ast
from pathlib import Path

import ftprof

PACKAGE = Path(ftprof.__file__).parent
CORE = ("config", "models", "engine", "profiling", "analysis", "results", "metrics", "ranks", "runtime", "data",
        "preflight", "exporters", "errors", "resolved", "plan", "units", "checks", "host_memory", "lifetime",
        "console")
# What runs during training, in ftprof.profiling: every module there but the trace file layout, which the analysis
# reads (it imports nothing of training).
CAPTURE = tuple(f"profiling.{p.stem}" for p in sorted((PACKAGE / "profiling").glob("*.py"))
                if p.stem not in ("__init__", "layout"))
# Banned imports by top-level part of ftprof: a package or module ("engine"), or a dotted module ("profiling.noop").
FORBIDDEN = {
    **{core: ("cli",) for core in CORE},
    "config": ("cli", "models", "engine", "plan", "preflight", "bench", "report", "results", "data", "profiling",
               "analysis"),
    "models": ("cli", "engine", "plan", "preflight", "bench", "report"),
    "resolved": ("cli", "engine", "plan", "preflight", "bench", "report"),
    # the planner predicts from models and config: below the engine (which asks it), bench and report
    "plan": ("cli", "engine", "preflight", "bench", "report"),
    "preflight": ("cli", "engine.build", "engine.trainer", "engine.loop", "engine.run", "bench", "report"),
    "bench": ("engine", "cli"),
    "report": ("engine", "models"),
    "results": ("engine", "models", "cli"),
    "analysis": ("cli", "engine", "models", "bench", "report", "data", "exporters", *CAPTURE),
    "profiling": ("cli", "analysis"),
}


def _module_name(path: Path) -> str | None:
    """ftprof.x.y for a file of the package (the package itself for an __init__.py); None outside it."""
    try:
        rel = path.resolve().relative_to(PACKAGE.resolve())
    except ValueError:
        return None
    parts = ["ftprof", *rel.with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_ftprof_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_name(path)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("ftprof")}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                if here is None:
                    continue
                package = here.split(".")
                if path.name != "__init__.py":
                    package = package[:-1]
                base = package[:len(package) - (node.level - 1)]
                module = ".".join(base + ([module] if module else []))
            if module.startswith("ftprof"):
                # ``from ftprof.x import y``: the submodule y where there is one, else the module x itself (a
                # package's __init__ runs before any of its submodules either way, and is not counted as an edge)
                submodules = {f"{module}.{a.name}" for a in node.names if _is_module(f"{module}.{a.name}")}
                found |= submodules
                if len(submodules) < len(node.names):
                    found.add(module)
    return found


def _is_module(name: str) -> bool:
    """Whether ftprof.x.y names a module or package of ftprof (not a function or class)."""
    rel = PACKAGE.joinpath(*name.split(".")[1:])
    return rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()


def _part(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _is_banned(module: str, banned: tuple[str, ...]) -> bool:
    return any(module == f"ftprof.{b}" or module.startswith(f"ftprof.{b}.") for b in banned)


def test_imports_flow_one_way():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        banned = FORBIDDEN.get(_part(path), ())
        for module in _imported_ftprof_modules(path):
            if _is_banned(module, banned):
                violations.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not violations, "\n".join(violations)


def test_the_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from ftprof.cli.common import add_common_arguments\n")
    assert "ftprof.cli.common" in _imported_ftprof_modules(bad)
    assert _is_banned("ftprof.profiling.noop", FORBIDDEN["analysis"])
    assert not _is_banned("ftprof.profiling.layout", FORBIDDEN["analysis"])
    assert "profiling.torch_profiler" in CAPTURE and "profiling.memory" in CAPTURE


def _import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (lazily or not)."""
    folder = PACKAGE.joinpath(*package.split(".")[1:])
    graph = {_module_name(p): set() for p in folder.rglob("*.py")}
    for path in folder.rglob("*.py"):
        graph[_module_name(path)] = {m for m in _imported_ftprof_modules(path) if m in graph} - {_module_name(path)}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph (its modules, the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph[node]):
            found = visit(nxt)
            if found:
                return found
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start)
        if found:
            return found
    return None


def test_no_import_circle_inside_the_analysis():
    graph = _import_graph("ftprof.analysis")
    assert "ftprof.analysis.pipeline" in graph and graph["ftprof.analysis.pipeline"]
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_sees_a_lazy_circle(tmp_path):
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    lazy = tmp_path / "m.py"
    lazy.write_text("def f():\n    from ftprof.analysis.pipeline import summarize\n")
    assert "ftprof.analysis.pipeline" in _imported_ftprof_modules(lazy)


def test_no_import_circle_in_the_package():
    """Counting imports inside functions: a lazy import is still an arrow between two modules."""
    graph = _import_graph("ftprof")
    assert len(graph) > 100 and graph["ftprof.preflight"]
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_a_submodule_import_is_an_arrow_to_the_submodule(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("def f():\n    from ftprof import metrics\n    from ftprof.plan import budget, PLAN_NAME\n")
    found = _imported_ftprof_modules(mod)
    assert "ftprof.metrics" in found and "ftprof" not in found
    assert {"ftprof.plan.budget", "ftprof.plan"} <= found  # PLAN_NAME is no module: the package itself
