"""The Slurm node source where Slurm preempts by QOS, as many sites do instead of a preemptible
partition: `PreemptType=preempt/qos`, `PreemptMode=CANCEL`, QOS `normal` preempts `scavenger`
(GraceTime 0), one partition `batch`, accounting in slurmdbd and MariaDB
(tests/support/slurm_accounting.py), on the host's Slurm 22.05 with 4 nodes.

`python -m app --source slurm --slurm-partition batch --slurm-qos scavenger`: the pilots take the
4 nodes in QOS scavenger for a job of real workers, a main job in QOS normal on 2 nodes starts
within 2 s because Slurm cancels 2 pilots and they give their nodes back at once, the job shrinks
to 2 and trains on, nothing of the preempted pilots is left, and the nodes are harvested again
once the main job ends."""
from __future__ import annotations

import time
from typing import Iterable, Iterator

import pytest

from app.__main__ import build_parser
from app.slurm_options import settings_from
from core.assemble import build
from core.schemas import JobSpec
from core.settings import HarvesterSettings
from tests.support.server import ROOT, start_app
from tests.support.slurm import MAIN_JOB_S, SlurmCluster, processes_with_env, start_cluster, steps_into_generation, submit_digits
from tests.support.slurm_accounting import ACCOUNT, PARTITION, SCAVENGER
from tests.support.waiting import wait

NODES = [f"node{i}" for i in range(1, 5)]
PILOT = "harvest-pilot"


@pytest.fixture(scope="module")
def qos_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    t0 = time.monotonic()
    cluster = start_cluster(tmp_path_factory.mktemp("slurm-qos"), nodes=len(NODES), preempt="qos")
    print(f"QOS cluster (MariaDB, slurmdbd, slurmctld, {len(NODES)} slurmd) up in {time.monotonic() - t0:.1f} s")
    try:
        yield cluster
    finally:
        left = cluster.stop()
        assert not left, f"left running after stop: {left}"
        assert cluster.database is not None and cluster.database.proc.poll() is not None, "MariaDB stopped"


@pytest.fixture
def cluster(qos_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    qos_cluster.wait_quiet()
    yield qos_cluster
    qos_cluster.wait_quiet()


def pilots(cluster: SlurmCluster, states: tuple[str, ...] = ("RUNNING",)) -> dict[str, dict]:
    """The pilots by node: job id, QOS, partition and account as squeue prints them."""
    out = cluster.run("squeue", "-h", "-t", "all", "-n", PILOT, "-o", "%i|%T|%N|%q|%P|%a").stdout
    rows = [dict(zip(("id", "state", "node", "qos", "partition", "account"), line.split("|")))
            for line in out.splitlines() if line.strip()]
    return {r["node"]: r for r in rows if r["state"] in states}


def pilot_processes(job_ids: Iterable[str]) -> list[int]:
    return [p for j in job_ids for p in processes_with_env(f"SLURM_JOB_ID={j}")]


def test_the_qos_and_account_options_reach_the_pilots_sbatch(cluster, tmp_path):
    """--slurm-partition, --slurm-qos and --slurm-account, read as `python -m app` reads them, are
    the pilots' own in Slurm (simulated workers: only the pilots are real)."""
    args = build_parser().parse_args(["--source", "slurm", *cluster.app_args(), "--slurm-partition", PARTITION,
                                      "--slurm-qos", SCAVENGER, "--slurm-account", ACCOUNT])
    h = build(HarvesterSettings.parse({"db": tmp_path / "h.db", "tick_s": 0.2, "live": {
        "source": "slurm", "dispatch": "simulated", "config": {"tfwd": 600}, "slurm": settings_from(args)}}))
    h.open()
    try:
        job = h.submit(JobSpec(name="sim", min_nodes=1, max_nodes=2, total_samples=1e12, curve="1:100, 2:200",
                               scale_up_seconds=0, scale_down_seconds=0), "alice")
        wait(lambda: h.snapshot.job(job.id)["nodes"] == 2, 30, "the job on 2 pilots' nodes")
        held = pilots(cluster)
        assert len(held) == 2, held
        assert {(p["qos"], p["partition"], p["account"]) for p in held.values()} == {(SCAVENGER, PARTITION, ACCOUNT)}, held
    finally:
        h.close()
    wait(lambda: not pilots(cluster, ("RUNNING", "PENDING")), 15, "every pilot cancelled at close")


def test_a_main_job_in_qos_normal_preempts_the_scavenger_pilots(cluster, tmp_path):
    # one rank per node: 4 workers of the digits example on 2 cores (as tests/test_slurm.py)
    app = start_app(tmp_path / "app", "--source", "slurm", *cluster.app_args(), "--slurm-partition", PARTITION,
                    "--slurm-qos", SCAVENGER, "--slurm-pilot-logs", str(tmp_path), "--workdir", str(ROOT),
                    "--no-profiler", "--slurm-slots", "1", "--tfwd", "600")
    try:
        jid = _preemption(app, cluster)
    finally:
        app.stop()
    print(app.output()[-3000:])
    assert not pilots(cluster, ("RUNNING", "PENDING")), "the harvester cancels its pilots when it stops"
    wait(lambda: not processes_with_env(f"HARVEST_JOB={jid}"), 15, "every worker gone with its pilot")


def _preemption(app, cluster: SlurmCluster) -> str:
    clu = lambda: app.get("/api/cluster")[1]
    c = clu()
    assert [n["name"] for n in c["nodes"]] == NODES and c["source"]["state"] == "ok", c["source"]

    jid = submit_digits(app, "digits on slurm, qos", len(NODES))
    wait(lambda: clu()["kpis"]["idle"] == len(NODES), 60, "pilots on all 4 nodes", clu)
    held = pilots(cluster)
    assert sorted(held) == NODES, held
    assert {(p["qos"], p["partition"]) for p in held.values()} == {(SCAVENGER, PARTITION)}, held
    get = lambda: app.get(f"/api/jobs/{jid}")[1]
    workers = lambda: get().get("workers") or {}
    world = lambda k: (lambda: workers().get("world_size") == k and not workers().get("regrouping")
                       and get()["nodes"] == k)
    wait(world(4), 150, "the job training on 4 nodes", workers)
    wait(lambda: steps_into_generation(workers(), 10), 30, "10 steps into the generation", workers)

    # a main job in QOS normal needs 2 nodes: Slurm cancels 2 scavenger pilots, which leave at once
    t0 = time.monotonic()
    main = cluster.sbatch("-p", PARTITION, "--qos=normal", "-N", "2", "--wrap", f"sleep {MAIN_JOB_S}", "-o", "/dev/null")
    wait(lambda: cluster.job_state(main) == "RUNNING", 10, "the main job to start", period=0.02)
    main_start = time.monotonic() - t0
    print(f"main job (QOS normal) started {main_start:.2f} s after its submission")
    assert main_start < 2.0, f"the main job started {main_start:.2f} s after its submission"
    taken = cluster.run("scontrol", "show", "hostnames", cluster.jobs()[main]["nodes"]).stdout.split()
    assert len(taken) == 2, taken
    preempted = [held[n]["id"] for n in taken]
    wait(lambda: {cluster.job_state(j) for j in preempted} == {"PREEMPTED"}, 10,
         "Slurm to end the 2 pilots as PREEMPTED", lambda: {j: cluster.job_state(j) for j in preempted})
    step = wait(lambda: world(2)() and workers()["committed_step"], 30, "the job shrunk to 2", workers)
    nodes = lambda: {n["name"]: n for n in clu()["nodes"]}
    wait(lambda: all(nodes()[n]["state"] == "busy" and nodes()[n]["source"] == "Slurm: allocated" for n in taken),
         5, "the grid to show the main job's nodes busy, allocated in Slurm", nodes)
    wait(lambda: not pilot_processes(preempted), 10, "nothing left of the preempted pilots")
    wait(lambda: workers()["committed_step"] > step + 5, 30, "the job to keep training on 2 nodes", workers)

    # the main job ends: its 2 nodes are harvested again by new pilots in QOS scavenger
    wait(lambda: cluster.job_state(main) not in ("RUNNING", "COMPLETING"), MAIN_JOB_S + 15, "the main job's end")
    wait(lambda: clu()["kpis"]["idle"] == len(NODES), 60, "the 2 nodes harvested again", clu)
    again = pilots(cluster)
    assert sorted(again) == NODES and {p["qos"] for p in again.values()} == {SCAVENGER}, again
    assert not {again[n]["id"] for n in taken} & set(preempted), "new pilots on the main job's nodes"
    assert get()["state"] == "running"
    return jid
