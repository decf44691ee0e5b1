"""Imports flow one way: the core never imports the CLI; models never import engine; bench never imports engine
or cli; report and results never import engine or models. Checked by parsing every module (lazy imports inside
functions count too)."""

import ast
from pathlib import Path

import ftprof

PACKAGE = Path(ftprof.__file__).parent
CORE = ("config", "models", "engine", "profiling", "results", "metrics", "ranks", "runtime", "data", "preflight",
        "exporters",
        "errors")
FORBIDDEN = {
    **{core: ("cli",) for core in CORE},
    "models": ("cli", "engine"),
    "bench": ("engine", "cli"),
    "report": ("engine", "models"),
    "results": ("engine", "models", "cli"),
}


def _imported_ftprof_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("ftprof")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("ftprof"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _part(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def test_imports_flow_one_way():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        banned = FORBIDDEN.get(_part(path), ())
        for module in _imported_ftprof_modules(path):
            parts = module.split(".")
            if len(parts) > 1 and parts[1] in banned:
                violations.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not violations, "\n".join(violations)


def test_the_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from ftprof.cli.common import add_common_arguments\n")
    assert "ftprof.cli.common" in _imported_ftprof_modules(bad)
