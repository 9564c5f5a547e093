"""Record what a real OpenPBS prints, for the parsers' unit tests (tests/data/pbs/): the test
cluster (tests/support/openpbs.py, 8 vnodes, vn007 and vn008 with ngpus = 2) brought into a state
with a job or vnode of every kind the harvester must read, then each command once.

    python -m tests.support.record_pbs tests/data/pbs

The state: vn001 runs a main job; vn002 a pilot (scavenger); vn003 a main job that preempted a
pilot by requeue (the pilot is queued again, run_count 1); vn004 is offline with a comment;
vn006 a main job that preempted a pilot by suspension (preempt_order "S": the pilot is `S`);
vn007 a pilot holding its 2 GPUs; vn005 and vn008 are free. Jobs also: one queued for the
offline vn004, one finished with exit status 3, one deleted while queued (both in history).
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from tests.support.openpbs import PbsCluster
from tests.support.server import ROOT

COMMENT = "disk replaced"
#: file -> the command whose output it holds
COMMANDS = {
    "pbsnodes-av.json": ("pbsnodes", "-av", "-F", "json"),
    "pbsnodes-a.json": ("pbsnodes", "-a", "-F", "json"),
    "qstat-f.json": ("qstat", "-f", "-F", "json"),
    "qstat-fx.json": ("qstat", "-f", "-F", "json", "-x"),
    "qselect-scavenger.txt": ("qselect", "-q", "scavenger"),
}
VERSIONS = (("pbsnodes", "--version"), ("qstat", "--version"))


def _preempt(pbs: PbsCluster, vnode: str, state: str) -> tuple[str, str]:
    """A pilot on `vnode`, then a main job there; returns both ids once the main job runs and
    the pilot is in `state`."""
    pilot = pbs.submit("scavenger", vnode, ["/bin/sleep", "600"], "harvest-pilot", extra=["-r", "y"])
    pbs.wait_job(pilot, "R")
    main = pbs.submit_main(vnode, 600)
    pbs.wait_job(main, "R", timeout=60)
    pbs.wait_job(pilot, state, timeout=30)
    return pilot, main


def stage(pbs: PbsCluster) -> None:
    pbs.submit_main("vn001", 600)
    pbs.submit("scavenger", "vn002", ["/bin/sleep", "600"], "harvest-pilot",
               extra=["-v", "HARVEST_HUB=10.0.0.1:7000,HARVEST_TOKEN=a/b=c", "-r", "y"])
    _preempt(pbs, "vn003", "Q")
    pbs.qmgr("set node vn004 state = offline")
    pbs.qmgr(f'set node vn004 comment = "{COMMENT}"')
    pbs.submit_main("vn004", 60, name="waits-for-vn004")
    pbs.qmgr('set sched preempt_order = "S"')
    _preempt(pbs, "vn006", "S")
    pbs.qmgr(f'set sched preempt_order = "{pbs.preempt_order}"')
    pbs.run(["qsub", "-q", "scavenger", "-N", "harvest-pilot", "-l", "select=1:ncpus=1:ngpus=2:vnode=vn007",
             "-j", "oe", "-o", "/dev/null", "-m", "n", "--", "/bin/sleep", "600"], check=True)
    failed = pbs.submit("main", "vn005", ["/bin/sh", "-c", "exit 3"], "fails")
    pbs.wait_job(failed, "F")
    held = pbs.run(["qsub", "-q", "main", "-h", "-N", "deleted", "-m", "n", "-o", "/dev/null", "-j", "oe",
                    "--", "/bin/true"], check=True).stdout.strip()
    pbs.run(["qdel", held], check=True)
    pbs.wait_job(held, "F")
    time.sleep(1)


def scrub(text: str) -> str:
    """The recording without this machine's checkout path (jobs' PBS_O_WORKDIR, Error_Path)."""
    return text.replace(str(ROOT), "/checkout")


def record(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="record-pbs-"))
    try:
        with PbsCluster(workdir, extra={"vn007": {"ngpus": 2}, "vn008": {"ngpus": 2}}) as pbs:
            stage(pbs)
            for name, argv in COMMANDS.items():
                (out / name).write_text(scrub(pbs.run(list(argv), check=True).stdout))
            versions = [pbs.run(list(argv), check=True).stdout for argv in VERSIONS]
            (out / "version.txt").write_text("".join(versions))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"recorded {', '.join(COMMANDS)} and version.txt in {out}", file=sys.stderr)


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tests.support.record_pbs DIR", file=sys.stderr)
        return 2
    record(Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
