"""Record what a real Slurm of one version prints, for the parsers' unit tests
(tests/data/slurm/<version>/): the test Slurm (tests/support/slurm.py) of that version, brought
into a state with a job or node of every kind the harvester must read, then each command once.

    python -m tests.support.record_slurm 24.11 tests/data/slurm/24.11

The state, on 5 nodes with 2 GPUs each: node1 runs a main job holding its GPUs; node2 runs a
main job that preempted a scavenger pilot (PREEMPTED); node3 holds a pilot that ignores SIGTERM
and was cancelled, so it is caught COMPLETING; node4 is drained with a reason; node5 is idle.
Jobs also: one FAILED (exit 3), one CANCELLED while pending, and one PENDING (it asks for all
5 nodes, one of which is drained).
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from tests.support.slurm import GPUS, SINFO_FORMAT, SQUEUE_FORMAT, SlurmCluster, start_cluster
from tests.support.waiting import wait

NODES = 5
DRAIN_REASON = "disk replaced"
#: file -> the command whose output it holds (None: not recorded where the command fails)
COMMANDS = {
    "sinfo.txt": ("sinfo", "-N", "-h", "-a", "-O", SINFO_FORMAT),
    "squeue.txt": ("squeue", "-h", "-t", "all", "-o", SQUEUE_FORMAT),
    "sinfo.json": ("sinfo", "--json"),
    "squeue.json": ("squeue", "--json", "--states=all"),     # 22.05 ignores the filter: all anyway
    "scontrol-nodes.json": ("scontrol", "show", "nodes", "--json"),
    "version.txt": ("sinfo", "--version"),
}


def stage(cluster: SlurmCluster) -> str:
    """Bring the cluster into the recorded state, all but the last step; returns the job id of
    the pilot to cancel right before recording."""
    sb = lambda *a: cluster.sbatch("-o", "/dev/null", *a)
    failed = sb("-p", "main", "-w", "node5", "-J", "fails", "--wrap", "exit 3")
    wait(lambda: cluster.job_state(failed) == "FAILED", 30, "a job FAILED")
    pilot2 = sb("-p", "scavenger", "-w", "node2", "-J", "harvest-pilot", "--wrap", "sleep 300")
    wait(lambda: cluster.job_state(pilot2) == "RUNNING", 15, "a pilot on node2")
    main2 = sb("-p", "main", "-w", "node2", "-J", "main-job", "--wrap", "sleep 300")
    wait(lambda: cluster.job_state(pilot2) == "PREEMPTED" and cluster.job_state(main2) == "RUNNING", 15,
           "the pilot on node2 PREEMPTED by a main job")
    main1 = sb("-p", "main", "-w", "node1", "-J", "gpu-job", "--gres", f"gpu:{GPUS}", "--wrap", "sleep 300")
    wait(lambda: cluster.job_state(main1) == "RUNNING", 15, "a main job with GPUs on node1")
    later = sb("-p", "main", "-w", "node5", "-J", "later", "--begin", "now+1hour", "--wrap", "sleep 1")
    cluster.run("scancel", later)
    wait(lambda: cluster.job_state(later) == "CANCELLED", 15, "a pending job CANCELLED")
    pilot3 = sb("-p", "scavenger", "-w", "node3", "-J", "harvest-pilot", "--wrap", "trap '' TERM; sleep 300")
    wait(lambda: cluster.job_state(pilot3) == "RUNNING", 15, "a pilot on node3")
    cluster.run("scontrol", "update", "NodeName=node4", "State=DRAIN", f"Reason={DRAIN_REASON}")
    pending = sb("-p", "main", "-N", str(NODES), "-J", "wide", "--wrap", "sleep 1")
    wait(lambda: cluster.job_state(pending) == "PENDING", 15, "a job PENDING")
    time.sleep(2)                  # a scheduling pass or two: the pending job's reason is Slurm's own
    if cluster.job_state(pilot3) != "RUNNING":
        raise RuntimeError(f"node3's pilot is {cluster.job_state(pilot3)}, not RUNNING")
    return pilot3


def record(cluster: SlurmCluster, out: Path) -> list[str]:
    """Stage, cancel node3's pilot, and write each command's output while it completes (slurmd
    waits at least 5 s before it kills a job that ignores SIGTERM). Returns the files written."""
    pilot = stage(cluster)
    cluster.run("scancel", pilot)
    wait(lambda: cluster.job_state(pilot) == "COMPLETING", 5, "the cancelled pilot COMPLETING")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, argv in COMMANDS.items():
        r = cluster.run(*argv, check=False)
        if r.returncode != 0:
            print(f"# {' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()[:200]} (not recorded)",
                  file=sys.stderr)
            continue
        (out / name).write_text(r.stdout)
        written.append(name)
    if cluster.job_state(pilot) != "COMPLETING":
        raise RuntimeError("the pilot finished completing while the outputs were recorded: run again")
    return written


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    version, out = argv[0], Path(argv[1]).resolve()
    with tempfile.TemporaryDirectory(prefix=f"record-slurm{version}-") as tmp:
        cluster = start_cluster(Path(tmp), NODES, version=version)
        try:
            written = record(cluster, out)
        finally:
            left = cluster.stop()
    print(f"Slurm {version}: {', '.join(written)} in {out}")
    if left:
        print(f"left running after stop: {left}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
