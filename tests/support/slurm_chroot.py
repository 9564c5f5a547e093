"""A Slurm other than the host's, for tests: Debian's packages of another release in a chroot
(24.11 from Debian 13 "trixie"), built once with debootstrap into a cache folder kept between
runs, and entered by the test cluster's init (tests/support/slurm_init.py) with the host's
paths the tests use bound in at the same paths.

    ensure_chroot("24.11")      # the chroot's folder, built (about a minute) and checked if need be
    python -m tests.support.slurm_chroot build 24.11      # the same, by hand

The cache is `/var/cache/harvest-tests/slurm-<version>` (HARVEST_SLURM_CHROOTS names another
parent folder). A build goes into `<folder>.tmp` and is renamed only once the checkout's Python
imports torch and numpy inside it, so an interrupted build is never used; a lock keeps two test
runs from building at once. The Debian mirror is the one this machine's apt sources name.
Anything missing fails the test with the reason: a test that needs Slurm never skips.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pytest

from tests.support import apt
from tests.support.files import ROOT

#: the Debian release whose packages give each Slurm version (sid moves on: a build checks that
#: it still ships the version named here)
RELEASES = {"24.11": "trixie", "26.05": "sid"}
CACHE_ENV = "HARVEST_SLURM_CHROOTS"
CACHE = Path("/var/cache/harvest-tests")
#: slurmdbd too, so that a cluster with accounting (QOS preemption) runs on this version as well
PACKAGES = ("slurm-wlm", "munge", "slurm-client", "slurmdbd")
#: what the modules of this checkout's interpreter (a pyenv build, not Debian's) link, as trixie
#: names them; its own python3 is not installed in the chroot
LIBRARIES = ("libssl3t64", "libsqlite3-0", "libffi8", "libbz2-1.0", "liblzma5", "libreadline8t64",
             "libtinfo6", "libuuid1", "zlib1g", "libnsl2", "libtirpc3t64", "libexpat1", "libncursesw6",
             "libstdc++6")
BUILD_TIMEOUT_S = 1200
STAMP = ".harvest-ready"
APT_SOURCES = (Path("/etc/apt/sources.list.d"), Path("/etc/apt/sources.list"))


def chroot_dir(version: str) -> Path:
    return Path(os.environ.get(CACHE_ENV) or CACHE) / f"slurm-{version}"


def fail(message: str) -> None:
    pytest.fail(message, pytrace=False)


# ---- the mirror --------------------------------------------------------------------------------
def apt_mirror(sources: Sequence[Path] = APT_SOURCES) -> str:
    """The URI of Debian's main archive as this machine's apt sources name it (deb822 `.sources`
    files or one-line `sources.list`), skipping the security and updates suites."""
    for item in sources:
        files = sorted(item.glob("*.sources")) + sorted(item.glob("*.list")) if item.is_dir() else [item]
        for f in files:
            try:
                text = f.read_text()
            except OSError:
                continue
            found = _deb822_mirror(text) if f.suffix == ".sources" else _one_line_mirror(text)
            if found:
                return found
    fail(f"no Debian mirror in the apt sources ({', '.join(map(str, sources))}): "
         "cannot build the chroot of another Slurm version")
    return ""


def _main_suite(suites: Sequence[str]) -> bool:
    return any(s and "-" not in s and "/" not in s for s in suites)


def _deb822_mirror(text: str) -> Optional[str]:
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" in fields.get("types", "").split() and _main_suite(fields.get("suites", "").split()):
            uris = fields.get("uris", "").split()
            if uris:
                return uris[0]
    return None


def _one_line_mirror(text: str) -> Optional[str]:
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", "", line).split()
        if len(words) >= 3 and words[0] == "deb" and _main_suite(words[2:3]):
            return words[1]
    return None


# ---- building -----------------------------------------------------------------------------------


def ensure_debootstrap() -> str:
    found = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin")
    if found:
        return found
    apt.ensure(["debootstrap"], ["debootstrap"], "debootstrap")
    return shutil.which("debootstrap") or "/usr/sbin/debootstrap"


def mounts_under(path: Path) -> list[str]:
    """Mount points of this mount namespace at or below `path`."""
    prefix = str(path.resolve())
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if target == prefix or target.startswith(prefix + "/"):
            out.append(target)
    return out


def _remove_tree(path: Path) -> None:
    """rm -r, refusing a tree with something mounted in it (that would delete the host's files)."""
    if not path.exists():
        return
    held = mounts_under(path)
    if held:
        fail(f"cannot remove {path}: mounts below it: {held[:5]}")
    shutil.rmtree(path)


def build(version: str, dest: Path, log=print) -> float:
    """debootstrap the release into `dest`.tmp, check it, rename it to `dest`; the seconds it took."""
    suite = RELEASES[version]
    t0 = time.monotonic()
    tmp = dest.with_name(dest.name + ".tmp")
    _remove_tree(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    # a private mount namespace: the /proc debootstrap mounts in the target goes with it, even
    # when it is killed half-way (one left on the host would block removing the folder)
    argv = ["unshare", "--mount", "--propagation", "private", "--", ensure_debootstrap(), "--variant=minbase",
            f"--include={','.join(PACKAGES + LIBRARIES)}", suite, str(tmp), apt_mirror()]
    log(f"# building the Slurm {version} chroot: {' '.join(argv)}", file=sys.stderr, flush=True)
    # its own process group: debootstrap is a shell script, and an interrupted build must take
    # its downloads and dpkg runs along instead of leaving them writing into the folder
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BUILD_TIMEOUT_S)
    except BaseException as e:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if isinstance(e, subprocess.TimeoutExpired):
            fail(f"debootstrap of {suite} did not finish within {BUILD_TIMEOUT_S} s")
        raise
    if proc.returncode != 0:
        fail(f"debootstrap of {suite} failed ({proc.returncode}):\n{out[-4000:]}")
    shipped = subprocess.run(["chroot", str(tmp), "dpkg-query", "-W", "-f", "${Version}", "slurm-wlm"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    if not shipped.startswith(version + "."):
        fail(f"Debian {suite} ships Slurm {shipped or '(none)'}, not {version}: update RELEASES")
    verify(tmp)
    os.rename(tmp, dest)
    took = time.monotonic() - t0
    log(f"# the Slurm {version} chroot is ready in {dest} ({took:.0f} s)", file=sys.stderr, flush=True)
    return took


@contextmanager
def _locked(dest: Path) -> Iterator[None]:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.with_name(dest.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_chroot(version: str) -> Path:
    """The chroot of this Slurm version, built if missing, and checked once per interpreter."""
    if version not in RELEASES:
        fail(f"no chroot recipe for Slurm {version} (known: {', '.join(RELEASES)})")
    if os.geteuid() != 0:
        fail(f"the Slurm {version} chroot needs root (chroot, mounts, debootstrap)")
    dest = chroot_dir(version)
    with _locked(dest):
        if not dest.is_dir():
            build(version, dest)
        stamp = dest / STAMP
        want = json.dumps({"python": sys.executable, "base_prefix": sys.base_prefix})
        if not stamp.exists() or stamp.read_text() != want:
            verify(dest)
            stamp.write_text(want)
    return dest


# ---- entering ----------------------------------------------------------------------------------
def host_paths(extra: Sequence[Path] = ()) -> list[Path]:
    """The host's folders bound into the chroot at the same paths: the temporary folder (the
    tests' own folders, pilots' logs), the checkout (its venv), the interpreter's base prefix,
    the network namespaces of the test hosts, and `extra`."""
    return [Path(tempfile.gettempdir()), ROOT, Path(sys.base_prefix), Path("/run/netns"), *extra]


def shared_mounts() -> list[str]:
    """Mounts of this mount namespace whose events propagate to a peer (another namespace)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        optional = fields[6:fields.index("-")]
        if any(f.startswith("shared:") for f in optional):
            out.append(fields[4])
    return out


def _mount(*argv: str) -> None:
    try:
        r = subprocess.run(["mount", *argv], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"mount {' '.join(argv)} did not return within 30 s") from None
    if r.returncode != 0:
        raise RuntimeError(f"mount {' '.join(argv)}: {r.stderr.strip()}")


def inside(root: Path, path: Path) -> Path:
    """`path` under `root`, refusing a symlink on the way: an absolute one (the chroot's
    /var/run -> /run) would lead a mkdir or a mount out of the chroot onto the host."""
    target = root
    for part in path.relative_to("/").parts:
        target = target / part
        if target.is_symlink():
            raise RuntimeError(f"{target} is a symlink in the chroot: cannot bind {path} there")
    return target


def enter(root: Path, paths: Sequence[Path]) -> list[str]:
    """Bind /proc, /dev, /etc/hosts and `paths` into `root` at the same paths, in this process's
    own mount namespace, which must propagate nothing (unshare's default): the mounts go with
    it. A path below one already bound, or missing on the host, is left out. Returns the
    mount points."""
    leaking = shared_mounts()
    if leaking:
        raise RuntimeError(f"this mount namespace shares mounts with another ({leaking[:3]}): "
                           "binding into the chroot would reach it; run under unshare --mount")
    inside(root, Path("/etc/hosts")).touch(exist_ok=True)
    done: list[str] = []
    for src, opt in ((Path("/proc"), "--bind"), (Path("/dev"), "--rbind"), (Path("/etc/hosts"), "--bind")):
        _mount(opt, str(src), str(inside(root, src)))
        done.append(str(inside(root, src)))
    bound: list[Path] = []
    for p in sorted({Path(os.path.realpath(p)) for p in paths}, key=lambda p: len(p.parts)):
        if not p.exists() or any(p == b or b in p.parents for b in bound):
            continue
        target = inside(root, p)
        if p.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch(exist_ok=True)
        _mount("--rbind", str(p), str(target))
        bound.append(p)
        done.append(str(target))
    return done


# ---- checking ----------------------------------------------------------------------------------
CHECK = "import torch, numpy"


def verify(root: Path) -> None:
    """The checkout's Python imports torch and numpy inside the chroot, with the binds in place;
    fails naming the libraries it lacks."""
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m",
                        "tests.support.slurm_chroot", "check", str(root)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        fail(f"the chroot {root} cannot run {sys.executable} -c {CHECK!r}:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")


def _check(root: Path) -> int:
    """In a private mount namespace: bind, run the import, and on failure list what is missing."""
    enter(root, host_paths())
    r = subprocess.run(["chroot", str(root), sys.executable, "-c", CHECK], capture_output=True, text=True,
                       timeout=240)
    if r.returncode == 0:
        return 0
    failed = sorted(set(re.findall(r"([\w.+-]+\.so[\w.]*): cannot open shared object file", r.stderr)))
    dynload = Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "lib-dynload"
    ldd = subprocess.run(["chroot", str(root), "/bin/sh", "-c", f'for f in "{dynload}"/*.so; do ldd "$f"; done'],
                         capture_output=True, text=True, timeout=120)
    others = sorted({ln.split()[0] for ln in ldd.stdout.splitlines() if "not found" in ln} - set(failed))
    print(f"missing in the chroot: {', '.join(failed) or 'no library named (see the error)'}"
          f"{'; the interpreter modules also lack ' + ', '.join(others) if others else ''}\n"
          f"{r.stderr[-3000:]}", file=sys.stderr)
    return 1


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check"] and len(argv) == 2:
        return _check(Path(argv[1]))
    if argv[:1] == ["build"] and len(argv) <= 2:
        try:
            print(ensure_chroot(argv[1] if len(argv) == 2 else "24.11"))
        except pytest.fail.Exception as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    print("usage: python -m tests.support.slurm_chroot build [VERSION] | check DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
