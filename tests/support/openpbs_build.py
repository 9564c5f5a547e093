"""OpenPBS for tests, built once from the vendored source (`../shared/vendor/openpbs-*.tar.gz`,
AGPL-3.0, unmodified; only the tests use it, the product never ships it) into a cache folder kept
between runs.

    ensure_openpbs()                          # the install prefix, built (minutes) if need be
    python -m tests.support.openpbs build     # the same, by hand or from `make test`

The cache is `/var/cache/harvest-tests/openpbs-<version>` (HARVEST_OPENPBS names another). Its
`pbs/` is the prefix (PBS_EXEC) and nothing outside the folder is written: no pbs_postinstall,
no /etc/pbs.conf, no /opt/pbs, and `make install`'s /etc/profile.d and systemd files go into the
prefix too. The compiled-in default pbs.conf is `<cache>/pbs.conf.unset`, a
file that never exists, so a daemon or command not given PBS_CONF_FILE fails instead of reading
the host's. A build is only used once its stamp is written; a lock makes parallel pytest workers
build it once. The build runs with a clean PATH and Debian's python3 (a pyenv Python on PATH
would be compiled in), under `nice -n 19`.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import pytest

from tests.support import apt

VERSION = "23.06.06"
VENDOR = Path(__file__).resolve().parents[3] / "shared" / "vendor"
TARBALL = VENDOR / "openpbs-cd7ab5e.tar.gz"
CACHE_ENV = "HARVEST_OPENPBS"
CACHE = Path("/var/cache/harvest-tests") / f"openpbs-{VERSION}"
STAMP = ".harvest-ready"
CLEAN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
PYTHON = "/usr/bin/python3"
BUILD_TIMEOUT_S = 3600
#: INSTALL's list for Debian, without sendmail (PBS only logs that it cannot mail)
PACKAGES = ("gcc", "make", "libtool", "libhwloc-dev", "libx11-dev", "libxt-dev", "libedit-dev",
            "libical-dev", "libncurses-dev", "perl", "postgresql-server-dev-all", "postgresql-contrib",
            "python3-dev", "tcl-dev", "tk-dev", "swig", "libexpat1-dev", "libssl-dev", "libxext-dev",
            "libxft-dev", "autoconf", "automake", "g++", "libcjson-dev", "expat", "libedit2",
            "postgresql", "python3", "sudo", "tcl", "tk", "libical3", "libcjson1", "pkg-config")
#: setuid root as pbs_postinstall makes them: a non-root user's commands authenticate through pbs_iff
SETUID = ("sbin/pbs_iff", "sbin/pbs_rcp")


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or CACHE)


def prefix_dir(cache: Path) -> Path:
    """PBS_EXEC: bin/, sbin/, lib/, libexec/ of the build."""
    return cache / "pbs"


def fail(message: str) -> None:
    pytest.fail(message, pytrace=False)


def log(message: str) -> None:
    print(f"# openpbs: {message}", file=sys.stderr, flush=True)


def missing_packages(packages: Sequence[str]) -> list[str]:
    """The packages dpkg does not report as installed."""
    r = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n", *packages],
                       capture_output=True, text=True, timeout=60)
    installed = {line.split()[0].split(":")[0] for line in r.stdout.splitlines() if line.endswith(" installed")}
    return [p for p in packages if p not in installed]


def _run(argv: Sequence[str], cwd: Path, build_log: Path, what: str, timeout: float = BUILD_TIMEOUT_S) -> None:
    """One build step under nice 19 with the clean environment, its output appended to
    `build_log`; a heartbeat line every minute. Killed as a whole group on any error."""
    env = {"PATH": CLEAN_PATH, "HOME": str(cwd), "LANG": "C", "PYTHON": PYTHON, "TMPDIR": "/tmp"}
    t0 = time.monotonic()
    log(f"{what} ...")
    with open(build_log, "a") as out:
        out.write(f"\n### {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(["nice", "-n", "19", *argv], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout:
                    raise subprocess.TimeoutExpired(argv, timeout)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    log(f"{what}: {time.monotonic() - t0:.0f} s so far (log {build_log})")
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if proc.returncode != 0:
        tail = build_log.read_text(errors="replace")[-3000:]
        fail(f"OpenPBS build step `{' '.join(argv)}` failed ({proc.returncode}):\n{tail}")
    log(f"{what}: done in {time.monotonic() - t0:.0f} s")


def build(cache: Path) -> float:
    """Unpack, configure (prefix and default pbs.conf inside `cache`), make, install; the
    seconds it took. The source tree is removed afterwards (it is 180 MB)."""
    if not TARBALL.is_file():
        fail(f"the OpenPBS source {TARBALL} is missing")
    t0 = time.monotonic()
    if cache.exists():
        shutil.rmtree(cache)
    src = cache / "src"
    src.mkdir(parents=True)
    need = missing_packages(PACKAGES)
    if need:
        if not apt.can_install():
            fail(f"OpenPBS's build needs {' '.join(need)} (apt-get install as root)")
        log(f"apt-get install {' '.join(need)}")
        apt.install(need, timeout=1800)
    log(f"unpacking {TARBALL.name}")
    with tarfile.open(TARBALL) as tar:
        tar.extractall(src, filter="tar")
    tree = next(p for p in src.iterdir() if p.is_dir())
    build_log = cache / "build.log"
    prefix = prefix_dir(cache)
    _run(["./autogen.sh"], tree, build_log, "autogen")
    _run(["./configure", f"--prefix={prefix}", f"--with-pbs-conf-file={cache / 'pbs.conf.unset'}",
          f"--with-pbs-server-home={cache / 'home.unset'}", f"PYTHON={PYTHON}"], tree, build_log, "configure")
    _run(["make", "-j2"], tree, build_log, "make -j2 (minutes; longer on a busy machine)")
    # make install would also put pbs.sh/pbs.csh into /etc/profile.d and pbs.service into
    # /lib/systemd/system: kept in the prefix instead
    _run(["make", "install", f"sysprofiledir={prefix / 'etc' / 'profile.d'}",
          f"unitfiledir={prefix / 'lib' / 'systemd'}"], tree, build_log, "make install")
    for name in SETUID:
        (prefix / name).chmod(0o4755)
    shutil.rmtree(src)
    took = time.monotonic() - t0
    (cache / STAMP).write_text(f"{VERSION} {TARBALL.name} built in {took:.0f} s\n")
    log(f"OpenPBS {VERSION} is ready in {prefix} ({took / 60:.1f} min)")
    return took


@contextmanager
def _locked(cache: Path) -> Iterator[None]:
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.with_name(cache.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_openpbs() -> Path:
    """The OpenPBS install prefix (PBS_EXEC), built first if the cache has no finished build."""
    if os.geteuid() != 0:
        fail("the OpenPBS test cluster needs root (its daemons, setuid pbs_iff, network namespaces)")
    cache = cache_dir()
    with _locked(cache):
        if not (cache / STAMP).is_file():
            build(cache)
    return prefix_dir(cache)
