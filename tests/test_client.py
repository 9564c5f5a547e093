"""The Python client (app/client.py) against a real `python -m app` with simulated live jobs (a
job runs at its curve in wall time, so that one finishes in seconds): submit, a refused job's
field errors, job, jobs and their filters, cancel, wait, and every refusal as one ApiError type;
and the client file copied alone, run by a Python without site-packages."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys

import pytest

from app.client import FINISHED, ApiError, Client
from tests.support.server import ROOT, free_port, password, start_app

LONG = {"min_nodes": 1, "max_nodes": 2, "total_samples": 1e9, "curve": "1:100, 2:190"}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    proc = start_app(tmp_path_factory.mktemp("client"), "--fresh", "--dispatch", "simulated",
                     "--local-nodes", "4", "--tick", "0.1")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(app) -> Client:
    return Client.login(app.url, "alice", password("alice"))


def test_submit_job_jobs_cancel_and_wait(app, alice):
    job = alice.submit(name="client long", **LONG)
    assert job["id"] and job["owner"] == "alice" and job["state"] in ("queued", "running")
    assert alice.wait(job["id"], states=("running",), timeout=10, poll_s=0.1)["state"] == "running"
    one = alice.job(job["id"])
    assert one["name"] == "client long" and one["curve"]["nodes"] == [1, 2] and "why" in one
    assert job["id"] in {j["id"] for j in alice.jobs(state="running")}
    assert job["id"] in {j["id"] for j in alice.jobs(owner="alice")}
    assert job["id"] not in {j["id"] for j in alice.jobs(owner="bob")}
    assert job["id"] not in {j["id"] for j in alice.jobs(state="done")}
    with pytest.raises(TimeoutError, match="still running"):
        alice.wait(job["id"], timeout=0.3, poll_s=0.1)
    assert alice.cancel(job["id"])["state"] == "cancelled"
    assert alice.wait(job["id"], timeout=5, poll_s=0.1)["state"] == "cancelled"
    with pytest.raises(ApiError) as again:
        alice.cancel(job["id"])
    assert again.value.status == 409

    short = alice.submit(name="client short", min_nodes=1, max_nodes=2, total_samples=300, curve="1:100, 2:190",
                         scale_up_seconds=0, scale_down_seconds=0)
    done = alice.wait(short["id"], timeout=30, poll_s=0.1)
    assert done["state"] == "done" and done["samples_done"] == pytest.approx(300), done
    assert short["id"] in {j["id"] for j in alice.jobs(state="done", owner="alice")}
    assert done["state"] in FINISHED


def test_a_refused_job_raises_api_error_with_the_servers_field_errors(app, alice):
    before = len(alice.jobs())
    with pytest.raises(ApiError) as refused:
        alice.submit(name="", min_nodes=3, max_nodes=2, total_samples=-1, curve="1:100")
    e = refused.value
    assert e.status == 422 and e.message == "invalid job"
    assert set(e.field_errors) == {"name", "max_nodes", "total_samples"}, e.field_errors
    assert "at least min nodes" in e.field_errors["max_nodes"]
    assert "max_nodes: max nodes (2) must be at least min nodes (3)" in str(e)
    with pytest.raises(ApiError) as unknown:
        alice.submit(name="typo", min_nodes=1, max_nodes=1, total_samples=10, curve="1:1", nodes=3)  # type: ignore[call-arg]
    assert unknown.value.status == 422 and "nodes" in unknown.value.field_errors
    assert len(alice.jobs()) == before, "a refused job is not stored"


def test_every_refusal_is_an_api_error(app, alice):
    with pytest.raises(ApiError) as wrong_token:
        Client(app.url, "not-a-token").submit(name="x", **LONG)
    assert wrong_token.value.status == 401 and "log in" in wrong_token.value.message
    with pytest.raises(ApiError) as no_token:
        Client(app.url).cancel("u-00000000")
    assert no_token.value.status == 401
    with pytest.raises(ApiError) as bad_password:
        Client.login(app.url, "alice", "wrong")
    assert bad_password.value.status == 401 and bad_password.value.message == "wrong user name or password"
    with pytest.raises(ApiError) as missing:
        alice.job("u-does-not-exist")
    assert missing.value.status == 404 and missing.value.field_errors == {}
    job = alice.submit(name="alice's", **LONG)
    with pytest.raises(ApiError) as not_yours:
        Client.login(app.url, "bob", password("bob")).cancel(job["id"])
    assert not_yours.value.status == 403
    staff = Client.login(app.url, "staff1", password("staff1"))
    assert staff.cancel(job["id"])["state"] == "cancelled"
    with pytest.raises(ApiError) as away:
        Client(f"http://127.0.0.1:{free_port()}").jobs()
    assert away.value.status == 0 and "cannot reach" in away.value.message


def test_the_client_file_alone_needs_only_the_standard_library(app, tmp_path):
    tree = ast.parse((ROOT / "app" / "client.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names
    shutil.copy(ROOT / "app" / "client.py", tmp_path / "client.py")
    script = ("import sys, client\n"
              "api = client.Client.login(sys.argv[1], 'alice', sys.argv[2])\n"
              "job = api.submit(name='copied client', min_nodes=1, max_nodes=1, total_samples=1e9, curve='1:10')\n"
              "print(api.cancel(job['id'])['state'])\n")
    # -E: no PYTHONPATH, -s: no user site, -S: no site-packages at all; the copy is found in the cwd
    r = subprocess.run([sys.executable, "-E", "-s", "-S", "-c", script, app.url, password("alice")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "cancelled", r.stdout + r.stderr
