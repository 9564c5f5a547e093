"""The tests' own layout, read with `ast` (nothing is imported): shared helpers live in
tests/support/, fixtures in tests/conftest.py, and a test module imports neither conftest nor
another test module; waiting is tests.support.waiting.wait, never a module's own copy."""
from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: names of the private waiting helpers that tests.support.waiting.wait replaced
WAITERS = {"wait", "wait_for", "poll"}


def all_test_modules() -> list[Path]:
    found = sorted(HERE.glob("test_*.py"))
    assert len(found) > 10, f"found only {found} in {HERE}"
    return found


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def is_test_or_conftest(name: str) -> bool:
    return name == "conftest" or name.startswith("test_")


def bad_imports(path: Path) -> list[str]:
    """`file:line: what` for each import of conftest or of a test module."""
    out = []
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
            names = []
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
            # `from tests import test_x` / `from . import conftest`: the names are modules
            names = [a.name for a in node.names] if node.level or node.module == "tests" else []
        else:
            continue
        for m in modules:
            if any(is_test_or_conftest(part) for part in m.split(".")):
                out.append(f"{path.name}:{node.lineno}: imports {'.' * getattr(node, 'level', 0)}{m}")
        out += [f"{path.name}:{node.lineno}: imports {n}" for n in names if is_test_or_conftest(n)]
    return out


def own_waiters(path: Path) -> list[str]:
    """`file:line: name` for each function (or variable) a test module names wait, wait_for or
    poll. A harness class's method is its own API, not a module helper, and is left alone."""
    tree = parse(path)
    methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and id(node) not in methods:
            if node.name in WAITERS:
                out.append(f"{path.name}:{node.lineno}: def {node.name}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and id(node) not in methods:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out += [f"{path.name}:{node.lineno}: {t.id} = ..." for t in targets
                    if isinstance(t, ast.Name) and t.id in WAITERS]
    return out


def test_no_module_imports_conftest_or_a_test_module():
    support = sorted((HERE / "support").glob("*.py"))
    assert support, "tests/support/ is missing"
    bad = [line for path in [*all_test_modules(), HERE / "conftest.py", *support] for line in bad_imports(path)]
    assert not bad, "import what you share from tests.support instead:\n" + "\n".join(bad)


def test_no_test_module_has_its_own_waiting_helper():
    bad = [line for path in all_test_modules() for line in own_waiters(path)]
    assert not bad, "use tests.support.waiting.wait (fail=False to get the last value):\n" + "\n".join(bad)


def test_the_tests_folder_holds_test_modules_and_conftest_only():
    stray = sorted(p.name for p in HERE.glob("*.py") if p.name != "conftest.py" and not p.name.startswith("test_"))
    assert not stray, f"support modules belong in tests/support/: {stray}"
