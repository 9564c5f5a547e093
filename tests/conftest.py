"""Fixtures shared by every test module: small trace and job-set files written into the test's
own folder, and (imported here so every module sees them) the session's loopback sshd and the
module's cluster of test hosts in network namespaces. Helpers that are not fixtures live in
tests/support/.

`make test` runs the suite in parallel (pytest-xdist, `--dist loadscope`): each module goes to one
worker whole, so its module-scoped servers start once; the modules that use this host's shared
resources (Slurm daemons, network namespaces and their subnets, Unix accounts) form one group,
`host`, run one test at a time and first, since it is the longest."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.browser import browser  # noqa: F401  (one headless Chromium per module that asks)
from tests.support.files import write_jobset, write_trace
from tests.support.netns import netns_cluster  # noqa: F401  (3 hosts in network namespaces, per module that asks)
from tests.support.openpbs import pbs_cluster  # noqa: F401  (an OpenPBS with 8 vnodes in a namespace, per module that asks)
from tests.support.sshd import sshd_server  # noqa: F401  (one loopback sshd per session, for every module)


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    """8 nodes in two racks going idle and busy over two hours."""
    rows = []
    for i in range(8):
        rows.append((f"2021-02-10T00:00:{i:02d}Z", f"r{i // 4:02d}n{i % 4:02d}", "idle"))
    rows += [("2021-02-10T00:30:00Z", "r00n00", "busy"), ("2021-02-10T00:30:00Z", "r00n01", "busy"),
             ("2021-02-10T01:00:00Z", "r00n00", "idle"), ("2021-02-10T01:00:00Z", "r00n01", "idle"),
             ("2021-02-10T01:30:00Z", "r01n03", "busy"), ("2021-02-10T02:00:00Z", "r01n03", "idle")]
    return write_trace(tmp_path / "trace.csv", rows)


@pytest.fixture
def small_jobs(tmp_path: Path) -> Path:
    return write_jobset(tmp_path / "jobs.csv", [
        "A,alex,2021-02-10T00:01:00Z,1,4,2000000,18,12,1;2;4,100;190;350",
        "B,vgg,2021-02-10T00:02:00Z,2,8,3000000,18,12,2;4;8,200;380;700",
        "C,res,2021-02-10T00:03:00Z,1,2,100000,18,12,1;2,50;90",
    ])


#: modules that start Slurm or PBS daemons, make network namespaces or Unix accounts: one at a time
HOST_GROUP = "host"
_USES_HOST = re.compile(r"tests\.support\.(slurm|netns|accounts|slurm_accounting|slurm_chroot|slurm_init|openpbs|record_pbs)\b"
                        r"|netns_cluster|pbs_cluster|unix_account|bench\.(facility|preemption|slurm|faults|pbs|coldstart)\b")
_host_modules: dict[Path, bool] = {}


def _uses_host(path: Path) -> bool:
    if path not in _host_modules:
        _host_modules[path] = path.is_file() and bool(_USES_HOST.search(path.read_text()))
    return _host_modules[path]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The host group first: it is the longest, and the other workers fill in around it."""
    items.sort(key=lambda item: not _uses_host(Path(str(item.fspath))))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """With `--dist loadscope`: each module whole on one worker, and every host module on the same
    one. (xdist's own `loadgroup` marks do not take under pytest 9, which ignores the node id
    xdist rewrites.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return HOST_GROUP if _uses_host(root / path) else path

    return ModuleScheduling(config, log)
