"""Owners' accounts inside PBS pilots (`--source pbs --run-as`), on the test OpenPBS
(tests/support/openpbs.py; the harvester's pilots run as root, which the test server's
`acl_roots` allows) with a Unix account of the test's own (tests/support/accounts.py): a mapped
login's job runs its rank as its owner's account, under sudo under the pilot that holds the
vnode (root), with that pilot's PBS job; an unmapped login's command job is refused. The rules
are the pilots' own (core/pilots/runas.py), tested in depth on Slurm by tests/test_slurm_run_as.py."""
from __future__ import annotations

import os
import pwd
from typing import Iterator

import pytest

from tests.support.accounts import LAUNCHER, SUDO, unix_account
from tests.support.openpbs import pbs_cluster  # noqa: F401  (the fixture)
from tests.support.server import start_app
from tests.support.waiting import wait
from tests.support.pbs_harvest import app_args, pilots
from tests.support.runas_checks import PYTHON, ancestors, env_of, exe, ranks, register, uids, users_file


@pytest.fixture(scope="module")
def account() -> Iterator[str]:
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is missing")
    with unix_account("harvpba") as a:
        yield a


def test_a_pbs_pilot_runs_a_mapped_users_rank_as_their_account(pbs_cluster, account, tmp_path_factory):
    import shutil
    import tempfile
    from pathlib import Path
    pbs = pbs_cluster
    shared = Path(tempfile.mkdtemp(prefix="harvtest-", dir="/tmp"))
    shared.chmod(0o755)
    try:
        users = users_file(shared / "users.json", {"alice": account})
        app = start_app(shared, "--fresh", *app_args(pbs, shared, ["vn005"]), "--run-as", LAUNCHER,
                        users=users, timeout=120)
        try:
            status, body = register(app, "bob")
            assert status == 422 and "not mapped to a Unix account" in body["errors"]["command"], body
            status, job = register(app, "alice")
            assert status == 201, job
            jid = job["id"]
            workers = lambda: app.get(f"/api/jobs/{jid}")[1].get("workers") or {}
            wait(lambda: workers().get("world_size") == 1 and (workers().get("committed_step") or 0) > 5, 150,
                 "alice's job training on vn005", workers)
            pilot_job = {v: j for j, v in pilots(pbs, "R").items()}["vn005"]
            (pid, raw), = ranks(jid).items()
            uid = pwd.getpwnam(account).pw_uid
            assert uids(pid) == (uid,) * 4, uids(pid)
            env = env_of(raw)
            assert env["PBS_JOBID"] == pilot_job and env["HARVEST_NODE"] == "vn005"
            chain = ancestors(pid)
            assert chain and exe(chain[0]) == SUDO, "the rank runs under the site's launcher"
            pilot = next(p for p in chain if exe(p) != SUDO)
            assert uids(pilot) == (0,) * 4, "under the pilot, as root"
        finally:
            app.stop()
            print(app.output()[-3000:])
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    wait(lambda: not pilots(pbs), 30, "no pilot left", lambda: pilots(pbs))
