"""docs/start/own-machines.md runs as written (issue 56, acceptance): the commands of its shell
block, read from the page, on four test hosts in network namespaces, the head in one of its own.

The head is a namespace too, so that step 3's `--host 0.0.0.0` listens on that test host's
addresses only (its loopback and its eth0), and its default port 8050 is its own. The page's
names become the test's: `/shared/harvest` a folder of links to this checkout (its .venv
included: step 1's `python3 -m venv ... pip install` is what `make test` already did, and is not
run again), `10.1.0.5` and `head01` the head's address; `node1`..`node3` are the hosts' ssh
aliases already. The site's ssh set-up (which the page takes as given: keys, a user, host names)
is an `ssh` first in PATH that adds `-F <the test hosts' config>`, and `harvest` (what `pip
install /shared/harvest` installs) runs app.harvest_cli. Nothing else is added to the commands.

The commands so run: `python -m app.users add` (twice, each password on stdin), `python -m app
check`, `python -m app --dispatch ssh ...`, `harvest login`, `harvest submit ... -- .venv/bin/python
examples/digits_cnn.py` and `harvest wait` (step 1's `python3 -m venv` and pip excepted).

Checked: step 2 passes 3 of 3 nodes; step 3 starts with one listener on port 8050 (0.0.0.0,
where two used to fail with EADDRINUSE) and every node in use; step 4's job (640,000 samples)
grows to 3 nodes and ends done with test accuracy >= 0.9, `harvest wait` exiting 0.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.files import ROOT
from tests.support.netns import NetnsCluster
from tests.support.procs import leftovers
from tests.support.waiting import wait

DOC = ROOT / "docs" / "start" / "own-machines.md"
HEAD = "node4"            # the test host the head runs in (not in the page's nodes.txt)
PORT = 8050               # the page's: the default
LINKED = ("app", "core", "examples", "data", "assets", ".venv", "requirements.txt", "pyproject.toml")
PASSWORDS = {"ops": "ops-password-1", "alice": "alice-password-1"}


def doc_steps(text: str) -> dict[int, list[str]]:
    """The page's first shell block as {step: [command, ...]}: continuation lines joined,
    comment lines dropped (a comment after a command stays: the shell drops it)."""
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    steps: dict[int, list[str]] = {}
    step, pending = 0, ""
    for line in block.splitlines():
        m = re.match(r"^# (\d)\. ", line)
        if m:
            step = int(m.group(1))
            steps[step] = []
            continue
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        steps[step].append(pending + line)
        pending = ""
    return steps


def test_doc_steps_are_read_as_the_page_writes_them():
    steps = doc_steps(DOC.read_text())
    assert sorted(steps) == [1, 2, 3, 4], steps
    assert [len(steps[k]) for k in (1, 2, 3, 4)] == [4, 1, 1, 3], steps
    start = steps[3][0]
    for flag in ("--dispatch ssh", "--nodes nodes.txt", '--workdir "$PWD"', "--advertise 10.1.0.5",
                 "--host 0.0.0.0", "--users users.json", "--trust-user-commands"):
        assert flag in start, (flag, start)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The test hosts, the shared checkout and the PATH with the site's ssh and `harvest`."""
    tmp = tmp_path_factory.mktemp("own-machines")
    with NetnsCluster(4, tmp / "netns") as cluster:
        checkout = tmp / "shared" / "harvest"
        checkout.mkdir(parents=True)
        for name in LINKED:
            (checkout / name).symlink_to(ROOT / name)
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        ssh = shutil.which("ssh")
        assert ssh, "ssh is missing (make test installs openssh-client)"
        (bin_dir / "ssh").write_text(f'#!/bin/sh\nexec {ssh} -F {shlex.quote(str(cluster.ssh_config))} "$@"\n')
        (bin_dir / "harvest").write_text(f'#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))} exec '
                                         f'{shlex.quote(sys.executable)} -m app.harvest_cli "$@"\n')
        for f in bin_dir.iterdir():
            f.chmod(0o755)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HARVEST_")}
        env.update(PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}", PYTHONUNBUFFERED="1")
        head = cluster.nodes[HEAD]
        text = DOC.read_text().replace("/shared/harvest", str(checkout)).replace("10.1.0.5", head) \
            .replace("head01", head)
        yield cluster, checkout, env, head, doc_steps(text), tmp


def sh(command: str) -> list[str]:
    return ["sh", "-c", command]


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {}


def test_the_page_runs_as_written(site):
    cluster, checkout, env, head, steps, tmp = site

    # 1. the nodes file and the accounts (the venv is this checkout's)
    first, *rest = steps[1]
    assert first == f"cd {checkout} && python3 -m venv .venv && .venv/bin/pip install -r requirements.txt", first
    assert (checkout / ".venv" / "bin" / "python").exists()
    for command in rest:
        user = next((u for u in PASSWORDS if f" add {u} " in command), None)
        r = subprocess.run(sh(command), cwd=checkout, env=env, capture_output=True, text=True, timeout=60,
                           input=f"{PASSWORDS[user]}\n" if user else None, start_new_session=True)  # no tty: stdin
        assert r.returncode == 0, (command, r.stdout, r.stderr)
    assert (checkout / "nodes.txt").read_text() == "node1 node1\nnode2 node2\nnode3 node3\n"
    assert {u["name"] for u in json.loads((checkout / "users.json").read_text())["users"]} == set(PASSWORDS)

    # 2. the nodes checked from the head
    [check] = steps[2]
    r = cluster.run(HEAD, sh(check), cwd=checkout, env=env, timeout=120)
    assert r.returncode == 0 and "3 of 3 nodes passed" in r.stdout, (r.stdout, r.stderr)

    # 3. the harvester, exactly as the page starts it
    [start] = steps[3]
    log = tmp / "harvester.log"
    with log.open("w") as out:
        proc = cluster.popen(HEAD, sh("exec " + start), cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://{head}:{PORT}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"the harvester exited with {proc.returncode}:\n{log.read_text()}"
            try:
                status, health = get(url + "/api/health")
                if status == 200 and health.get("nodes"):
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            assert time.monotonic() < deadline, f"no answer at {url}:\n{log.read_text()}"
            time.sleep(0.3)
        listeners = cluster.run(HEAD, ["ss", "-ltnH", f"sport = :{PORT}"]).stdout.split("\n")
        listeners = [ln.split()[3] for ln in listeners if ln.strip()]
        assert listeners == [f"0.0.0.0:{PORT}"], listeners          # one listener: the wildcard covers HEAD
        nodes = {n["name"]: n for n in get(url + "/api/cluster")[1]["nodes"]}
        assert sorted(nodes) == ["node1", "node2", "node3"], nodes
        assert not any(n.get("source") for n in nodes.values()), nodes   # none held out by its check

        # 4. the client, from elsewhere (this namespace), with alice's password from the environment
        client = tmp / "alice"
        client.mkdir()
        cenv = {**env, "HARVEST_PASSWORD": PASSWORDS["alice"], "HARVEST_TOKEN_FILE": str(client / "token")}
        script = "set -e\n" + "\n".join(steps[4]) + '\necho "job=$JOB"\n'
        r = subprocess.run(["sh", "-c", script], cwd=client, env=cenv, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, (r.stdout, r.stderr, log.read_text()[-3000:])
        jid = re.search(r"^job=(\S+)$", r.stdout, re.M).group(1)
        status, job = get(f"{url}/api/jobs/{jid}")
        assert status == 200 and job["state"] == "done" and job["samples_done"] == 640_000, job
        lines = [json.loads(ln) for p in (checkout / "harvest.db.workers" / jid).glob("*.log")
                 for ln in p.read_text().splitlines() if ln.startswith("{")]
        assert max(ln.get("world", 0) for ln in lines) == 3, "grows to 3 nodes"
        final = [ln for ln in lines if ln.get("final")]
        assert final and final[-1]["test_accuracy"] >= 0.9, final
        wait(lambda: not leftovers(jid), 30, "no process of the job left", lambda: leftovers(jid))
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0 and "stopped; state saved in harvest.db" in log.read_text(), log.read_text()[-2000:]
