"""Small modules and short functions, checked: no module of the package over 500 lines, no function over 60 (from
its def line to its last line, decorators not counted)."""

import ast
from pathlib import Path

import ftprof

PACKAGE = Path(ftprof.__file__).parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def long_parts(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{path.relative_to(root)}: {lines} lines")
        for fn in _functions(ast.parse(text, filename=str(path))):
            length = fn.end_lineno - fn.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{path.relative_to(root)}:{fn.lineno} {fn.name}: {length} lines")
    return found


def test_no_long_module_or_function():
    assert long_parts(PACKAGE) == []


def test_the_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n")
    assert long_parts(tmp_path) == [f"m.py:1 f: {MAX_FUNCTION_LINES + 1} lines"]
