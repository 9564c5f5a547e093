"""The Slurm path across hosts: `python -m app --source slurm --advertise HEAD` with each pilot, and
so each worker it starts, on its own test host (a network namespace at its own address, whose
127.0.0.1 is its own). Pilots say hello to the hub from the nodes' addresses, a job trains on all
3 nodes, a main job preempts 2 pilots and the harvester vacates those nodes, new pilots harvest
them again when it ends, and nothing is left.

Slurm's daemons stay on loopback and only the batch script enters its node's namespace (the
fixture's `--slurm-python` wrapper: `exec nsenter --net=<ns of $SLURMD_NODENAME> python`, same
PID, so Slurm's SIGTERM still reaches the pilot). The harvester talks to the pilot and its workers,
never to slurmd, so this puts on other hosts everything the advertised address is for, keeps the
Slurm set-up measured in tests/support/slurm.py, and adds no routing between slurmctld and
namespaced slurmd (a second Slurm configuration to keep working, for Slurm's own traffic)."""
from __future__ import annotations

import time

from tests.support.server import ROOT, start_app
from tests.support.slurm import MAIN_JOB_S, parent, processes_with_env, slurm_netns_cluster, submit_digits  # noqa: F401  (the fixture)
from tests.support.waiting import wait

NODES = ["node1", "node2", "node3"]
TAKEN = ["node2", "node3"]          # the main job's nodes


def env_of(raw: bytes) -> dict[str, str]:
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw.split(b"\0") if item)


def pilot_processes(job_ids) -> dict[int, dict[str, str]]:
    """The pilots' own processes, outer PID -> environment: not their workers, nor what a pilot
    runs for a moment on the harvester's behalf (a node check, a forked child before its exec)."""
    found = {pid: env_of(raw) for j in job_ids for pid, raw in processes_with_env(f"SLURM_JOB_ID={j}").items()
             if "HARVEST_JOB" not in env_of(raw)}
    return {pid: env for pid, env in found.items() if parent(pid) not in found}


def workers_of(job_id: str) -> dict[str, int]:
    """node -> PID of the job's worker there."""
    return {env_of(raw)["HARVEST_NODE"]: pid for pid, raw in processes_with_env(f"HARVEST_JOB={job_id}").items()}


def test_pilots_on_namespaced_hosts_dial_the_advertised_hub_and_vacate_for_a_main_job(slurm_netns_cluster,
                                                                                       tmp_path):
    slurm, hosts = slurm_netns_cluster.slurm, slurm_netns_cluster.hosts
    slurm.wait_quiet()
    # one rank per node (each has 2 GPUs): this test is about hosts, one worker on each
    app = start_app(tmp_path / "app", "--source", "slurm", *slurm.app_args(),
                    "--slurm-python", str(slurm_netns_cluster.python), "--slurm-pilot-logs", str(tmp_path),
                    "--advertise", hosts.head, "--worker-env", "GLOO_SOCKET_IFNAME", "--tfwd", "600",
                    "--workdir", str(ROOT), "--no-profiler", "--slurm-slots", "1",
                    env={"GLOO_SOCKET_IFNAME": "eth0"})
    try:
        jid, pilots = _harvest_preempt_vacate(app, slurm, hosts)
    finally:
        app.stop()
    print(app.output()[-3000:])
    assert not [j for j in slurm.jobs().values() if j["job_state"] in ("RUNNING", "PENDING")
                and j["name"] == "harvest-pilot"], "the harvester cancels its pilots when it stops"
    wait(lambda: not workers_of(jid), 15, "every worker gone", lambda: workers_of(jid))
    wait(lambda: not pilot_processes(pilots), 15, "every pilot process gone")
    wait(lambda: not any(hosts.pids(n) for n in NODES), 15, "nothing running in the test hosts",
         lambda: {n: hosts.pids(n) for n in NODES})


def _harvest_preempt_vacate(app, slurm, hosts):
    head, addr = hosts.head, hosts.nodes
    clu = lambda: app.get("/api/cluster")[1]
    # pilots come for a job that can use the nodes
    jid = submit_digits(app, "digits on namespaced slurm", 3)
    wait(lambda: clu()["kpis"]["idle"] == 3, 60, "pilots on all 3 nodes", clu)
    pilots = {j["nodes"]: j["job_id"] for j in slurm.jobs().values()
              if j["name"] == "harvest-pilot" and j["job_state"] == "RUNNING"}
    assert sorted(pilots) == NODES, pilots

    # each pilot runs in its node's namespace and is connected to the hub on the advertised address
    hub = None
    for n in NODES:
        procs = pilot_processes([pilots[n]])
        assert len(procs) == 1, (n, procs)
        (pid, env), = procs.items()
        assert pid in hosts.pids(n), f"the pilot of {n} runs in {n}'s namespace"
        host, _, port = env["HARVEST_PILOT_HUB"].rpartition(":")
        assert host == head, env["HARVEST_PILOT_HUB"]
        hub = (head, int(port))
        assert hub in hosts.peers(n, pid), (n, hosts.peers(n, pid))
    hub_peers = lambda: {a for a, _ in hosts.peers(None, app.proc.pid, local=hub)}
    assert hub_peers() == {addr[n] for n in NODES}, "the hub's pilots said hello from the nodes' addresses"

    get = lambda: app.get(f"/api/jobs/{jid}")[1]
    workers = lambda: get().get("workers") or {}
    world = lambda k: (lambda: workers().get("world_size") == k and not workers().get("regrouping")
                       and get()["nodes"] == k)
    wait(world(3), 90, "the job training on 3 nodes", workers)
    running = workers_of(jid)
    for n in NODES:               # the child of the pilot that holds the node, so in its namespace
        pid = running[n]
        assert parent(pid) in pilot_processes([pilots[n]]), f"the worker of {n} runs in {n}'s pilot"
        assert pid in hosts.pids(n), f"the worker of {n} runs in {n}'s namespace"
        env = env_of(processes_with_env(f"HARVEST_JOB={jid}")[pid])
        assert env["HARVEST_STORE"].rpartition(":")[0] == head, env
    step = wait(lambda: workers()["committed_step"], 30, "a committed step", workers)

    # a main job needs node2 and node3: Slurm preempts their pilots, the harvester vacates them
    t0 = time.monotonic()
    main = slurm.sbatch("-p", "main", "-N", "2", "-w", ",".join(TAKEN), "--wrap", f"sleep {MAIN_JOB_S}", "-o", "/dev/null")
    wait(lambda: slurm.job_state(main) == "RUNNING", 10, "the main job to start", period=0.02)
    print(f"main job started {time.monotonic() - t0:.2f} s after its submission")
    wait(world(1), 30, "the job shrunk to node1", workers)
    nodes = lambda: {n["name"]: n for n in clu()["nodes"]}
    wait(lambda: all(nodes()[n]["state"] == "busy" and nodes()[n]["source"] == "Slurm: allocated" for n in TAKEN),
         5, "the grid to show the main job's nodes busy, allocated in Slurm", nodes)
    wait(lambda: not pilot_processes(pilots[n] for n in TAKEN), 10, "nothing left of the preempted pilots")
    wait(lambda: sorted(workers_of(jid)) == ["node1"], 10, "the workers on node2, node3 gone", lambda: workers_of(jid))
    wait(lambda: not any(hosts.pids(n) for n in TAKEN), 10, "nothing running in node2, node3",
         lambda: {n: hosts.pids(n) for n in TAKEN})
    assert hub_peers() == {addr["node1"]}, hub_peers()
    assert workers_of(jid)["node1"] == running["node1"], "node1's worker went on through the regroup"
    step = max(step, workers()["committed_step"])
    wait(lambda: workers()["committed_step"] > step + 5, 30, "the job to keep training on node1", workers)

    # the main job ends: new pilots harvest node2 and node3 again, in their namespaces
    wait(lambda: slurm.job_state(main) == "COMPLETED", MAIN_JOB_S + 15, "the main job to complete",
         lambda: slurm.job_state(main))
    wait(world(3), 60, "the job grown back to 3", workers)
    again = {j["nodes"]: j["job_id"] for j in slurm.jobs().values()
             if j["name"] == "harvest-pilot" and j["job_state"] == "RUNNING"}
    assert sorted(again) == NODES and again["node1"] == pilots["node1"], (pilots, again)
    running = workers_of(jid)
    for n in TAKEN:
        assert again[n] != pilots[n] and parent(running[n]) in pilot_processes([again[n]]), n
        assert running[n] in hosts.pids(n), f"the new worker of {n} runs in {n}'s namespace"
    assert hub_peers() == {addr[n] for n in NODES}, hub_peers()
    return jid, {*pilots.values(), *again.values()}
