"""Accounting for the test Slurm, which `preempt/qos` needs (QOS live in the accounting database):
a MariaDB server in the test's own folder and slurmdbd beside slurmctld.

`start_database(d)` runs MariaDB (as root, so that nothing in the test's private folders needs
opening to another account) on a free loopback port, with `setpriv --pdeathsig KILL`: it dies with
the test process even if that is killed; `Database.stop()` stops it by PID. `accounting_conf`
turns slurm.conf to QOS preemption and writes `slurmdbd.conf` and the accounts' set-up beside it;
the Slurm init (tests/support/slurm_init.py) calls `start_slurmdbd` between munged and slurmctld,
so slurmdbd runs and ends inside the cluster's PID namespace with the other daemons.

For their connections to slurmdbd, Slurm 22.05's clients (sacctmgr, sacct) and slurmctld ask
munge on the socket `AccountingStoragePass` names, not AuthInfo's, and without it on munge's
default /run/munge/munge.socket.2 (measured: "Failed to access /run/munge/munge.socket.2").
slurm.conf names the test munged's socket there, so nothing under /run is touched.
"""
from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support import apt
from tests.support.ports import free_port
from tests.support.waiting import wait

if TYPE_CHECKING:
    from tests.support.slurm_init import Init

PACKAGES = ("mariadb-server", "slurmdbd")
DAEMONS = ("mariadbd", "mariadb-install-db", "mariadb", "slurmdbd", "sacctmgr")
READY_WAIT_S = 60.0
STOP_WAIT_S = 30.0
DBD_CONF = "slurmdbd.conf"
#: the accounts' set-up, one sacctmgr command a line, run by the init once slurmdbd answers
SETUP_FILE = "accounting.sacctmgr"
DB_NAME = "slurm_acct_db"
#: the one partition of a QOS cluster (all nodes), the pilots' QOS and the users' account
PARTITION = "batch"
SCAVENGER = "scavenger"
ACCOUNT = "harvest"
#: users the tests submit as (Enforce=associations refuses a job of a user without an association)
USERS = ("root",)


def ensure_accounting() -> None:
    """apt-get install mariadb-server slurmdbd if a program is missing; fails loudly otherwise."""
    apt.ensure(DAEMONS, PACKAGES, "Slurm accounting")


# ---- MariaDB ------------------------------------------------------------------------------------
@dataclass
class Database:
    """A running mariadbd (its own PID: setpriv execs it) and the account slurmdbd uses."""
    dir: Path
    port: int
    proc: subprocess.Popen
    user: str
    password: str

    @property
    def socket(self) -> Path:
        return self.dir / "mysqld.sock"

    def sql(self, statements: str, timeout: float = 30.0) -> str:
        """Run SQL as MariaDB's root over the Unix socket (root@localhost authenticates by uid)."""
        r = subprocess.run(["mariadb", "--no-defaults", f"--socket={self.socket}", "-u", "root", "-N", "-e",
                            statements], capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"mariadb -e {statements!r}: {r.stderr.strip()}")
        return r.stdout

    def stop(self) -> bool:
        """SIGTERM by PID, SIGKILL after STOP_WAIT_S; True if it had to be killed."""
        if self.proc.poll() is not None:
            return False
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_WAIT_S)
            return False
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_WAIT_S)
            return True

    def log(self, lines: int = 20) -> str:
        p = self.dir / "mariadb.err"
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) if p.exists() else "(no log)"


def start_database(d: Path) -> Database:
    """A fresh MariaDB in `d` on a free loopback port, with `slurm_acct_db` and a user for
    slurmdbd; ready (it answers) when this returns. --no-defaults: the host's /etc/mysql is not read."""
    ensure_accounting()
    d.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(d / "data", ignore_errors=True)      # a folder used before: start from nothing
    opts = ["--no-defaults", "--user=root", f"--datadir={d / 'data'}", "--innodb-log-file-size=8M"]
    r = subprocess.run(["mariadb-install-db", *opts, "--skip-test-db", "--auth-root-authentication-method=socket"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"mariadb-install-db: exit {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    port = free_port()
    log = open(d / "mariadbd.out", "ab")
    proc = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "--", "mariadbd", *opts, f"--port={port}",
                             "--bind-address=127.0.0.1", "--skip-name-resolve", f"--socket={d / 'mysqld.sock'}",
                             f"--pid-file={d / 'mariadbd.pid'}", f"--log-error={d / 'mariadb.err'}"],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    db = Database(d, port, proc, "slurm", secrets.token_hex(16))
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited with {proc.returncode}:\n{db.log()}")
            if not db.socket.exists():
                return False
            try:
                db.sql("select 1", timeout=5)
                return True
            except RuntimeError:
                return False
        wait(up, READY_WAIT_S, "MariaDB to answer", db.log)
        db.sql(f"create database {DB_NAME}; create user '{db.user}'@'127.0.0.1' identified by '{db.password}'; "
               f"grant all on {DB_NAME}.* to '{db.user}'@'127.0.0.1'")
    except BaseException:
        db.stop()
        raise
    return db


# ---- slurm.conf, slurmdbd.conf and the accounts ---------------------------------------------------
DBD = """\
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket.2
DbdHost=localhost
DbdPort={dbd_port}
SlurmUser=root
PidFile={d}/run/slurmdbd.pid
LogFile={d}/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db.port}
StorageUser={db.user}
StoragePass={db.password}
StorageLoc={db_name}
"""


def _swap(text: str, pattern: str, new: str) -> str:
    """Replace the one line `pattern` matches; a conf template that changed fails loudly here."""
    text, n = re.subn(pattern, new, text, flags=re.MULTILINE)
    if n != 1:
        raise RuntimeError(f"slurm.conf: expected one line matching {pattern!r}, found {n}")
    return text


def accounting_conf(d: Path, conf: str, db: Database, dbd_port: int, users: tuple[str, ...] = USERS) -> str:
    """`conf` (slurm.conf's text, partition preemption) turned to QOS preemption with accounting in
    slurmdbd, one partition PARTITION over all nodes; writes slurmdbd.conf (0600: it holds the
    database password) and the accounts' set-up beside it."""
    cluster = re.search(r"^ClusterName=(\S+)", conf, re.MULTILINE)
    if cluster is None:
        raise RuntimeError("slurm.conf has no ClusterName")
    sock = f"{d}/munge/munge.socket.2"
    conf = _swap(conf, r"^AccountingStorageType=.*$",
                 "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n"
                 f"AccountingStoragePort={dbd_port}\nAccountingStoragePass={sock}\n"
                 "AccountingStorageEnforce=associations,qos")
    conf = _swap(conf, r"^PreemptType=.*$", "PreemptType=preempt/qos")
    conf = _swap(conf, r"^PreemptMode=.*$", "PreemptMode=CANCEL")
    conf = _swap(conf, r"^PartitionName=main .*$", f"PartitionName={PARTITION} Nodes=ALL Default=YES State=UP")
    conf = _swap(conf, r"^PartitionName=scavenger .*\n", "")
    fd = os.open(d / DBD_CONF, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(DBD.format(d=d, dbd_port=dbd_port, db=db, db_name=DB_NAME))
    c = cluster.group(1)
    setup = [f"add cluster {c}", f"add qos {SCAVENGER} PreemptMode=cancel GraceTime=0",
             f"modify qos normal set preempt={SCAVENGER}", f"add account {ACCOUNT} cluster={c}",
             *[f"add user {u} account={ACCOUNT} cluster={c}" for u in users],
             # every association of the user (root has one in account root too, its default)
             *[f"modify user {u} set qos=normal,{SCAVENGER}" for u in users]]
    (d / SETUP_FILE).write_text("\n".join(setup) + "\n")
    return conf


def dbd_port(d: Path) -> int:
    m = re.search(r"^DbdPort=(\d+)", (d / DBD_CONF).read_text(), re.MULTILINE)
    if m is None:
        raise RuntimeError(f"no DbdPort in {d / DBD_CONF}")
    return int(m.group(1))


def answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def start_slurmdbd(init: "Init") -> None:
    """In the Slurm init, after munged and before slurmctld (which will not start without it):
    slurmdbd (it reads slurmdbd.conf from $SLURM_CONF's folder), then the accounts and QOS."""
    port = dbd_port(init.dir)
    init.spawn("slurmdbd", ["slurmdbd", "-D"])

    def up() -> bool:
        if not init.alive("slurmdbd"):
            raise RuntimeError("slurmdbd exited; see log/slurmdbd.log and log/slurmdbd.out")
        return answers(port)
    init.wait(up, READY_WAIT_S, "slurmdbd to answer on its port")
    for line in (init.dir / SETUP_FILE).read_text().splitlines():
        try:
            r = init.slurm("sacctmgr", "-i", *shlex.split(line), timeout=30)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"sacctmgr {line}: no answer within {e.timeout:g} s") from e
        if r.returncode != 0:
            raise RuntimeError(f"sacctmgr {line}: exit {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
