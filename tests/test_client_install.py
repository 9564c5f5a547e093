"""The client as users get it (pyproject.toml): `pip install <checkout>` into a new virtual
environment gives `from app.client import Client` and the `harvest` command, run from another
folder with no PYTHONPATH, and nothing else: the package holds app/__init__.py, app/client.py
and app/harvest_cli.py, needs no other package (nothing but the standard library), and leaves
the server's modules (and their Dash, torch, ...) out. No network: the wheel is built by this
.venv's pip and setuptools (as pip does for `pip install <checkout>`) from a copy of the
checkout, and installed with --no-index."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.support.files import ROOT
from tests.support.ports import free_port

CLIENT_FILES = {"app/__init__.py", "app/client.py", "app/harvest_cli.py"}
#: what the copy leaves out: environments, history, data, build output, stores
SKIP = shutil.ignore_patterns(".venv", ".git", "data", "__pycache__", "*.pyc", ".pytest_cache", "build", "*.egg-info",
                              "*.db", "*.db-*", "*.db.*", "runs", "out", "users.json")


def run(*cmd, cwd: Path, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd}: {r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the new environment, the wheel it was installed from)."""
    tmp = tmp_path_factory.mktemp("install")
    checkout = tmp / "checkout"
    shutil.copytree(ROOT, checkout, ignore=SKIP)
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
        "--wheel-dir", tmp / "wheels", checkout, cwd=tmp)
    wheel, = (tmp / "wheels").glob("harvest_client-*.whl")
    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)     # sees neither .venv nor the checkout
    # this pip, run for the new environment; --no-index: a dependency would fail to resolve
    run(sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--quiet", "--no-index", wheel,
        cwd=tmp)
    return venv, wheel


def outside(venv: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """A command of the new environment, run from a folder outside the checkout, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "HARVEST_"))}
    env["HOME"] = str(tmp_path)
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)


def test_the_wheel_holds_the_client_modules_only_and_needs_nothing(installed):
    _, wheel = installed
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert {n for n in names if ".dist-info/" not in n} == CLIENT_FILES
    assert "Requires-Dist" not in meta and "Requires-Python: >=3.11" in meta, meta
    assert "harvest = app.harvest_cli:main" in entry_points
    assert (ROOT / "app" / "__init__.py").read_text().strip() == "", "app/__init__.py imports nothing"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == []


def test_the_client_imports_and_harvest_runs_outside_the_checkout(installed, tmp_path):
    venv, _ = installed
    r = outside(venv, tmp_path, "python", "-c",
                "import app.client, app.harvest_cli; from app.client import ApiError, Client, JobFailed; "
                "print(app.client.__file__)")
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).is_relative_to(venv) and not Path(r.stdout.strip()).is_relative_to(ROOT), r.stdout
    r = outside(venv, tmp_path, "python", "-c", "import app.web")
    assert r.returncode == 1 and "No module named 'app.web'" in r.stderr, r.stderr
    r = outside(venv, tmp_path, "python", "-c", "import core")
    assert r.returncode == 1 and "No module named 'core'" in r.stderr, r.stderr

    r = outside(venv, tmp_path, "harvest", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: harvest"), r.stderr
    assert all(c in r.stdout for c in ("login", "submit", "status", "wait", "cancel", "logs"))
    r = outside(venv, tmp_path, "harvest", "--url", f"http://127.0.0.1:{free_port()}", "status")
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.startswith("harvest: error: no answer: cannot reach") and r.stderr.count("\n") == 1, r.stderr
