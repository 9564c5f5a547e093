"""GPU nodes on Slurm: one rank per GPU. Against the real test Slurm (tests/support/slurm.py: 8
nodes with `Gres=gpu:2`, each GPU a stand-in device file that Slurm binds like a real one):
the source reads 2 slots per node from Slurm's GRES (`--slurm-slots` overrides it), the pilots
ask for the node's GPUs (`--gres gpu:2`), Slurm binds them to the pilot and its workers inherit
the binding, and a main job still preempts such a pilot at once. Slurm's GRES strings as other
sites print them (types, sockets, several entries, none at all) come from fake sinfo JSON.

End to end through `python -m app --source slurm` and the API: each pilot starts both ranks of
its node (LOCAL_RANK 0 and 1, its children, in its Slurm job, with its GPUs), a main job that
preempts one node takes both of its ranks, and the job goes on and finishes with exactly its
samples."""
from __future__ import annotations

import sys
import time

import pytest

from app.__main__ import build_parser, settings_from
from core.runtime import ranks
from core.assemble import build, node_source
from core.schemas import JobSpec
from core.settings import HarvesterSettings
from core.slurm.cli import SlurmCli, gpu_count
from core.slurm.provider import sbatch_options
from core.pilots.settings import SettingError, PilotSettings
from core.pilots.transport import PilotTransport
from core.transports.base import NodeSpec
from tests.support.fakeslurm import fake_slurm, slurm_source
from tests.support.procs import environ_of, leftovers, run_module, worker_pid
from tests.support.server import ROOT, start_app
from tests.support.pace import PaceFile
from tests.support.slurm import (GPUS, MAIN_JOB_S, alive, parent, processes_with_env, slurm_cluster,  # noqa: F401  (the fixture)
                                 steps_into_generation)
from tests.support.waiting import wait

NODES = [f"node{i}" for i in range(1, 9)]
HARVESTED = NODES[:3]                # the end-to-end test's nodes (2 ranks each: 6 processes on 2 cores)
GLOBAL_BATCH = 60                    # not a multiple of 4: the shards of 4 and 6 ranks differ in size
TOTAL = GLOBAL_BATCH * 900
#: what Slurm's gres/gpu puts in the environment of a job it bound GPUs 0 and 1 to
BOUND = {"CUDA_VISIBLE_DEVICES": "0,1", "ROCR_VISIBLE_DEVICES": "0,1", "ZE_AFFINITY_MASK": "0,1",
         "GPU_DEVICE_ORDINAL": "0,1"}


@pytest.fixture
def cluster(slurm_cluster):
    slurm_cluster.wait_quiet()
    yield slurm_cluster
    slurm_cluster.wait_quiet()


def live_settings(cluster, *options: str) -> HarvesterSettings:
    """The settings `python -m app --source slurm OPTIONS` would run with."""
    return settings_from(build_parser().parse_args(["--source", "slurm", *cluster.app_args(), *options]))


# ---- slots from the GRES -----------------------------------------------------------------------
def test_gres_strings_count_gpus_the_way_slurm_prints_them():
    assert [gpu_count(g) for g in ("gpu:4", "gpu:a100:4", "gpu:a100:4(S:0-1)", "gpu:2(S:0,2)",
                                   "gpu:a100:2(S:0),gpu:v100:2(S:1)", "gpu:4,mps:400", "nic:1,gpu:1",
                                   "gpu", "gpu:a100", "gpu:tesla_v100-sxm2-16gb:6(S:0-1)")] == \
        [4, 4, 4, 2, 4, 4, 1, 1, 1, 6]
    assert [gpu_count(g) for g in ("", "(null)", "nic:1", "mps:400", "gpu:0", "gpu:x:y:z", "gpus:4")] == [0] * 7


def test_the_source_reads_two_slots_per_node_from_slurms_gres(cluster):
    nodes = SlurmCli(str(cluster.conf), bin_dir=cluster.bin).nodes()
    assert [(n.name, n.gres, n.gpus) for n in nodes] == [(n, f"gpu:{GPUS}", GPUS) for n in NODES]
    for options, slots in (((), GPUS), (("--slurm-slots", "3"), 3), (("--slurm-slots", "1"), 1)):
        source, specs, _ = node_source(live_settings(cluster, "--slurm-dry-run", *options).live)
        try:
            assert [(s.name, s.slots) for s in specs] == [(n, slots) for n in NODES], options
        finally:
            source.close()


def test_a_node_without_gpus_has_one_slot_and_its_pilot_asks_for_none(tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch, gres=[None, "gpu:a100:2(S:0),gpu:v100:2(S:1),nic:1"])
    source = slurm_source(PilotSettings(dry_run=True))
    try:
        assert [source.slots_of(n) for n in ("node1", "node2")] == [1, 4]
        assert "--gres" not in sbatch_options(source.settings, "node1", source._slurm["node1"])
        opts = sbatch_options(source.settings, "node2", source._slurm["node2"])
        assert opts[opts.index("--gres"):][:2] == ["--gres", "gpu:4"], "all the node's GPUs, any type"
    finally:
        source.close()
    (tmp_path / "again").mkdir()
    fake_slurm(tmp_path / "again", monkeypatch, gres=["(null)", ""])
    source = slurm_source(PilotSettings(dry_run=True, slots=2))
    try:
        assert [source.slots_of(n) for n in ("node1", "node2")] == [2, 2], "--slurm-slots for every node"
        assert "--gres" not in sbatch_options(source.settings, "node1", source._slurm["node1"])
    finally:
        source.close()


def test_slots_are_checked_with_the_option_named():
    for bad in (-1, 1025, 2.0, True):
        with pytest.raises(SettingError) as e:
            PilotSettings(slots=bad)
        assert e.value.field == "slots"
    assert PilotSettings(slots=1024).slots == 1024
    r = run_module("app", "--source", "slurm", "--slurm-slots", "2000")
    assert r.returncode == 2 and "error: --slurm-slots: must be a whole number from 0 to 1,024" in r.stderr, r.stderr


# ---- pilots hold the GPUs ----------------------------------------------------------------------
def test_pilots_ask_for_the_gpus_slurm_binds_them_and_workers_inherit_the_binding(cluster, tmp_path):
    h = build(HarvesterSettings.parse({"db": tmp_path / "h.db", "tick_s": 0.2, "live": {
        "source": "slurm", "dispatch": "simulated", "config": {"tfwd": 600},
        "slurm": {**cluster.slurm_settings(), "watch": ("node[1-2]",)}}}))
    h.open()
    try:                                     # a job that can use both nodes: pilots come for it
        h.submit(JobSpec(name="sim", min_nodes=1, max_nodes=2, total_samples=1e12, curve="1:100, 2:200",
                         scale_up_seconds=0, scale_down_seconds=0), "alice")
        wait(lambda: h.snapshot.kpis["idle"] == 2, 30, "pilots on node1, node2")
        pilots = {n: h.source.hub.link(n).job for n in ("node1", "node2")}
        for n, j in pilots.items():
            assert cluster.job_gres(j) in (f"gres:gpu:{GPUS}", f"gres/gpu:{GPUS}"), cluster.job_gres(j)
            procs = processes_with_env(f"SLURM_JOB_ID={j}")
            assert procs, n
            env = environ_of(next(iter(procs)))
            assert {k: env.get(k) for k in BOUND} == BOUND, f"Slurm binds {n}'s GPUs to its pilot"

        # a worker the pilot starts sees the pilot's GPUs and Slurm job, nothing else of it
        transport = PilotTransport(h.source.hub)
        handle = transport.start(NodeSpec("node1", slots=GPUS), [sys.executable, "-c", "import time; time.sleep(60)"],
                                 {"HARVEST_PROBE": "1"}, "", str(tmp_path / "probe.log"))
        try:
            env = environ_of(wait(lambda: list(processes_with_env("HARVEST_PROBE=1")), 10, "the worker")[0])
            assert {k: env.get(k) for k in BOUND} == BOUND
            assert env["SLURM_JOB_ID"] == pilots["node1"] and env["SLURM_GPUS_ON_NODE"] == str(GPUS)
            assert not [k for k in env if k.startswith("HARVEST_PILOT_")], "the pilot's token stays its own"
        finally:
            transport.stop(handle, 1.0)

        # holding GPUs does not slow preemption down: a main job takes node2 at once
        t0 = time.monotonic()
        main = cluster.sbatch("-p", "main", "-w", "node2", "-N", "1", "--gres", f"gpu:{GPUS}", "--wrap", "sleep 1",
                              "-o", "/dev/null")
        wait(lambda: cluster.job_state(main) in ("RUNNING", "COMPLETING", "COMPLETED"), 10,
             "the main job to start", period=0.02)
        assert time.monotonic() - t0 < 2.0, f"the main job started {time.monotonic() - t0:.2f} s after its submission"
        wait(lambda: h.snapshot.kpis["idle"] == 1 or cluster.job_state(main) != "RUNNING", 5, "node2's leave")
    finally:
        h.close()
    wait(lambda: not processes_with_env("HARVEST_PROBE=1"), 10, "the probe worker gone")


# ---- end to end --------------------------------------------------------------------------------
# once, on the host's Slurm: what differs between versions here (the GRES each pilot is given and
# binds) is tested on both by the test above; the ranks per node are the harvester's alone
@pytest.mark.parametrize("slurm_cluster", ["22.05"], indirect=True)
def test_a_job_runs_one_rank_per_gpu_and_a_preempted_node_takes_both(cluster, tmp_path):
    app = start_app(tmp_path / "app", "--source", "slurm", *cluster.app_args(),
                    "--slurm-watch", ",".join(HARVESTED), "--slurm-pilot-logs", str(tmp_path),
                    "--tfwd", "600", "--workdir", str(ROOT), "--no-profiler")
    try:
        jid, pilots = _two_ranks_per_node(app, cluster, PaceFile(tmp_path, 0.05))
    finally:
        app.stop()
    print(app.output()[-3000:])
    assert not [j for j in cluster.jobs().values() if j["job_state"] in ("RUNNING", "PENDING")
                and j["name"] == "harvest-pilot"], "the harvester cancels its pilots when it stops"
    wait(lambda: not leftovers(jid), 15, "every worker gone with its pilot")
    wait(lambda: not [p for j in pilots.values() for p in processes_with_env(f"SLURM_JOB_ID={j}")], 15,
         "every pilot process gone")


def _two_ranks_per_node(app, cluster, pace: PaceFile) -> tuple[str, dict[str, str]]:
    clu = lambda: app.get("/api/cluster")[1]
    status, job = app.request("POST", "/api/jobs", {
        "name": "digits, a rank per GPU", "min_nodes": 1, "max_nodes": len(HARVESTED), "total_samples": TOTAL,
        "curve": "1:100, 3:300", "scale_up_seconds": 0, "scale_down_seconds": 0, "global_batch": GLOBAL_BATCH,
        "command": [sys.executable, "examples/digits_cnn.py", "--seed", "5", *pace.args,
                    "--log-every", "1000000"]}, token=app.token("alice"))
    assert status == 201, job
    wait(lambda: clu()["kpis"]["idle"] == len(HARVESTED), 60, "pilots on the 3 nodes", clu)
    pilots = {j["nodes"]: str(j["job_id"]) for j in cluster.jobs().values()
              if j["name"] == "harvest-pilot" and j["job_state"] == "RUNNING"}
    assert sorted(pilots) == HARVESTED, pilots
    jid = job["id"]
    get = lambda: app.get(f"/api/jobs/{jid}")[1]
    seen: dict[int, dict] = {}

    def workers() -> dict:
        w = get().get("workers") or {}
        for g in w.get("generations") or []:
            seen[g["gen"]] = g
        return w
    at = lambda n: (lambda: (lambda w: w.get("nodes") == n and w.get("world_size") == n * GPUS
                             and not w.get("regrouping"))(workers()))
    wait(at(3), 150, "3 nodes x 2 ranks", workers)
    wait(lambda: steps_into_generation(workers(), 10), 30, "10 steps into the generation", workers)

    # each pilot started both ranks of its node: its children, in its Slurm job, with its GPUs
    for n in HARVESTED:
        pilot_pids = set(processes_with_env(f"SLURM_JOB_ID={pilots[n]}"))
        for key in ranks.keys_of(n, GPUS):
            pid = worker_pid(jid, key)
            assert pid, f"no worker for {key}"
            env = environ_of(pid)
            assert parent(pid) in pilot_pids and env["SLURM_JOB_ID"] == pilots[n], key
            assert env["LOCAL_RANK"] == str(ranks.slot_of(key)) and env["LOCAL_WORLD_SIZE"] == str(GPUS), env
            assert {k: env.get(k) for k in BOUND} == BOUND, f"{key} sees the GPUs Slurm bound to its pilot"
            assert not [k for k in env if k.startswith("HARVEST_PILOT_")], "the pilot's token stays its own"

    # a main job takes node3: Slurm preempts its pilot, and both of its ranks go at once
    victim = HARVESTED[-1]
    pids = [worker_pid(jid, k) for k in ranks.keys_of(victim, GPUS)]
    t0 = time.monotonic()
    main = cluster.sbatch("-p", "main", "-w", victim, "-N", "1", "--wrap", f"sleep {MAIN_JOB_S}", "-o", "/dev/null")
    wait(lambda: not any(alive(p) for p in pids), 10, f"both ranks of {victim} gone", period=0.02)
    vacate_s = time.monotonic() - t0
    wait(lambda: cluster.job_state(main) in ("RUNNING", "COMPLETING", "COMPLETED"), 10, "the main job to start")
    assert vacate_s < 2.0, f"{victim}'s ranks were gone {vacate_s:.2f} s after the main job's submission"
    wait(at(2), 30, "the job on 2 nodes x 2 ranks", workers)
    assert get()["state"] == "running"

    pace.release()
    wait(lambda: (workers(), get()["state"] == "done")[1], 300, "the job to finish", get)
    final = get()
    assert final["samples_done"] == TOTAL, final
    sizes = {len(g["members"]) for g in seen.values()}
    assert {4, 6} <= sizes and all(k % GPUS == 0 for k in sizes), f"a node's ranks came or went apart: {sizes}"
    print(f"both ranks of a preempted node gone {vacate_s:.2f} s after the main job's submission")
    return jid, pilots
