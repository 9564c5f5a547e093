"""Start the real dashboard process (`python -m app`) on a free loopback port for a test, and
stop it by PID. Shared by the API, browser, restart and benchmark code."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from werkzeug.security import generate_password_hash

from tests.support.files import ROOT
from tests.support.ports import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
#: the users every server started here knows (password = name + "-password")
USERS = {"staff1": "staff", "alice": "user", "bob": "user"}


def password(name: str) -> str:
    return f"{name}-password"


def write_users(path: Path, users: dict[str, str] = USERS) -> Path:
    path.write_text(json.dumps({"users": [
        {"name": n, "role": r, "password_hash": generate_password_hash(password(n), method="pbkdf2:sha256:1000")}
        for n, r in users.items()]}))
    return path


@dataclass
class AppProcess:
    proc: subprocess.Popen
    url: str
    db: Path
    log: Path

    def get(self, path: str, token: Optional[str] = None) -> tuple[int, dict | str]:
        return self.request("GET", path, token=token)

    def request(self, method: str, path: str, body=None, token: Optional[str] = None,
                raw: Optional[bytes] = None) -> tuple[int, dict | str]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, text

    def metrics(self) -> dict[tuple, float]:
        """/metrics as {(sample name, sorted labels): value}."""
        from prometheus_client.parser import text_string_to_metric_families
        status, text = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}: {str(text)[:200]}")
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def token(self, name: str) -> str:
        status, body = self.request("POST", "/api/token", {"username": name, "password": password(name)})
        assert status == 200, body
        return body["token"]

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode


def start_app(workdir: Path, *args: str, db: Optional[Path] = None, users: Optional[Path] = None,
              timeout: float = 60, env: Optional[dict[str, str]] = None, trust_users: bool = True) -> AppProcess:
    """`python -m app --port <free> --db <workdir>/harvest.db --users <users> *args` (with `env`
    added to this process's environment), waiting until /api/health answers. A live server
    (`--dispatch`/`--source`) gets `--trust-user-commands` unless `trust_users` is False or it
    maps users (`--run-as`): these tests run every job as the test's own account."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    db = db or workdir / "harvest.db"
    users = users or write_users(workdir / "users.json")
    log = workdir / f"app-{port}.log"
    env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    env.pop("HARVEST_USERS", None)
    env.pop("HARVEST_USERS_FILE", None)
    if trust_users and ("--dispatch" in args or "--source" in args) and "--run-as" not in args:
        args = (*args, "--trust-user-commands")
    fh = log.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(port),
                             "--db", str(db), "--users", str(users), *args],
                            cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env)
    app = AppProcess(proc, f"http://127.0.0.1:{port}", db, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the app exited with {proc.returncode}:\n{app.output()}")
        try:
            status, body = app.get("/api/health")
            if status == 200 and body.get("nodes"):
                return app
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    app.stop(signal.SIGKILL)
    raise RuntimeError(f"the app did not answer within {timeout} s:\n{app.output()}")


def browser_or_skip():
    """Playwright's sync API for the browser tests, or the module skipped with the reason (at
    module level: `sync_api = browser_or_skip()`)."""
    import pytest
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make test installs Debian's chromium)", allow_module_level=True)
    return pytest.importorskip("playwright.sync_api",
                               reason="playwright is not installed (make test installs requirements-dev.txt)")
