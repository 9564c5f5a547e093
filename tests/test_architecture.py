"""The architecture contract (.importlinter): core never imports app, no cycle between core's
modules and packages, app reaches core only through its public surface. `make test` runs
lint-imports; these tests also show that the contract breaks when an import breaks it."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-logo", "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_the_tree_keeps_the_contract():
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("KEPT") == 3


@pytest.mark.parametrize("file,line,broken", [
    ("core/model.py", "import app.format  # noqa", "core never imports app BROKEN"),
    ("core/transports/local.py", "from ..pilots import wire  # noqa", "no cycle between the modules and packages of core BROKEN"),
    ("app/format.py", "from core.controller import Controller  # noqa", "explain) BROKEN"),
])
def test_an_import_that_breaks_the_contract_fails_it(tmp_path, file, line, broken):
    for part in ("core", "app", ".importlinter"):
        src = ROOT / part
        (shutil.copytree(src, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
         if src.is_dir() else shutil.copy(src, tmp_path / part))
    target = tmp_path / file
    target.write_text(target.read_text() + "\n" + line + "\n")
    r = lint(tmp_path)
    assert r.returncode != 0, r.stdout
    text = " ".join(r.stdout.split())
    assert broken in text and "1 broken" in text, r.stdout
