"""The job's store against a non-member (loopback only): forged writes are never read, the state
sync never unpickles, and `bind_host` restricts where the store listens. Real worker processes run
examples/digits_cnn.py with the coordinator's environment, as in tests/test_coordinator.py."""
from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from core.runtime import group
from core.runtime import protocol as P
from core.runtime.coordinator import JobCoordinator
from core.runtime.signing import SignedStore, namespace, signed
from tests.support.waiting import wait
from tests.support.workers import WorkerProcs, worker_env

ROOT = Path(__file__).resolve().parent.parent
GB = 64
STEPS = 700
TOTAL = GB * STEPS
FORGED_STEP = STEPS - 3


class Intruder:
    """A non-member: a plain TCPStore client of the job's port, without the secret. It lists the
    keys (TCPStore lets any client do so) to learn the namespace, then writes what a member
    would write there, and the same keys without the namespace."""

    def __init__(self, port: int) -> None:
        self.store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=10))
        progress = [k for k in self.store.list_keys() if k.endswith("/" + P.PROGRESS)]
        assert len(progress) == 1, self.store.list_keys()
        self.ns = progress[0][:-len(P.PROGRESS)]

    def write(self, key: str, value: dict | str) -> None:
        raw = value if isinstance(value, str) else P.encode(value)
        self.store.set(self.ns + key, raw)
        self.store.set(key, raw)

    def forge_events(self, gen: int, incs: dict[str, int]) -> None:
        """Events with an impossible step: stopped/finished, synced, first_step, ready. The
        first ones go to the next event numbers (the workers' own events overwrite them); the
        last one takes a number of its own, so it is read, rejected, then skipped as a hole."""
        n = self.store.add(self.ns + P.EVENT_COUNTER, 0)
        fake = [{"ev": P.EV_STOPPED, "gen": gen, "step": FORGED_STEP, "reason": P.STOP_FINISHED},
                {"ev": P.EV_SYNCED, "gen": gen, "rank": 0, "step": FORGED_STEP, "src": 0},
                {"ev": P.EV_FIRST_STEP, "gen": gen, "step": FORGED_STEP},
                {"ev": P.EV_READY, "step": FORGED_STEP}]
        for i, (node, inc) in enumerate(incs.items()):
            for j, msg in enumerate(fake[:3]):
                self.write(P.event_key(n + 1 + 3 * i + j),
                           {**msg, "node": node, "inc": inc, "pid": 1, "t": time.time()})
        m = self.store.add(self.ns + P.EVENT_COUNTER, 1)
        node, inc = next(iter(incs.items()))
        self.write(P.event_key(m), {**fake[3], "node": node, "inc": inc, "pid": 1, "t": 0})

    def forge_commands_and_progress(self, gen: int, incs: dict[str, int]) -> None:
        self.write(P.PROGRESS, {"gen": gen, "step": FORGED_STEP, "world": 9, "rank": 0})
        for node, inc in incs.items():
            self.write(P.heartbeat_key(node, inc), "999999")
            for k in range(40):             # every next command: exit, or a bogus generation
                op = {"op": P.OP_EXIT} if k % 2 else {"op": P.OP_RUN, "gen": gen + 1, "rank": 0,
                                                      "world": 1, "members": [node]}
                self.write(P.cmd_key(node, inc, k), op)

    def replay_rendezvous(self, gen: int) -> int:
        """Copy the genuine (tagged) rendezvous values of generation `gen` to the keys the next
        generation will use: a tag bound to another key must not pass."""
        old, new = f"/{P.group_prefix(gen)}/", f"/{P.group_prefix(gen + 1)}/"
        keys = [k for k in self.store.list_keys() if old in k]
        for k in keys:
            self.store.set(k.replace(old, new), self.store.get(k))
        return len(keys)


@pytest.fixture
def secured_job(tmp_path: Path):
    coord = JobCoordinator("sec", GB, TOTAL, bind_host="127.0.0.1", pg_timeout_s=10.0)
    workers = WorkerProcs(tmp_path, coord, ("--log-every", "100", "--seed", "0", "--step-seconds", "0.01"))
    try:
        yield workers
    finally:
        workers.kill_all()
        coord.close(grace_s=0.5)


def test_forged_writes_by_a_non_member_are_never_read(secured_job: WorkerProcs) -> None:
    w, coord = secured_job, secured_job.coord
    for node in "ABC":
        w.start(node)
    wait(lambda: {"A", "B", "C"} <= coord.ready(), 60, "A, B, C ready", w.diag, 0.02)
    assert coord.regroup(["A", "B"]) == 1
    wait(w.first_step_of(1), 30, "first step on 2 nodes", w.diag, 0.02)
    wait(lambda: coord.status()["committed_step"] >= 60, 30, "60 steps", w.diag, 0.02)

    bad = Intruder(coord.address[1])
    assert "sec" not in bad.ns and coord.secret not in bad.ns
    bad.forge_commands_and_progress(1, w.incs)
    bad.forge_events(1, w.incs)
    assert bad.replay_rendezvous(1) > 0
    wait(lambda: coord.status()["forged_reads"] >= 3, 10, "the forged values read", w.diag, 0.02)
    time.sleep(2.5)                                     # the forged event's hole is skipped
    st = coord.status()
    assert st["committed_step"] < FORGED_STEP and st["generation"] == 1, st
    assert st["members"] == ["A", "B"] and st["ready"] == ["C"] and not st["finished"], st
    assert all(p.poll() is None for p in w.procs.values()), w.diag()

    assert coord.regroup(["A", "B", "C"]) == 2          # C (fresh) takes the members' state
    wait(w.first_step_of(2), 30, "first step on 3 nodes", w.diag, 0.02)
    wait(lambda: coord.status()["finished"], 60, "job finished", w.diag, 0.05)
    for node, p in w.procs.items():
        assert p.wait(20) == 0, (node, w.diag())

    final = coord.status()
    assert final["committed_step"] == STEPS and final["samples_done"] == TOTAL
    assert final["lost_samples"] == 0 and final["forged_reads"] >= 3
    gens = coord.generations()
    assert [g["members"] for g in gens] == [["A", "B"], ["A", "B", "C"]]
    for g in gens:
        assert len({s["checksum"] for s in g["synced"].values()}) == 1, g
        assert {s["src"] for s in g["synced"].values()} <= {0, 1}, g    # a member was the source
        assert len({s["checksum"] for s in g["stopped"].values()}) == 1, g
    before, after = gens
    assert after["start_step"] == before["end_step"] < FORGED_STEP
    # the state C took is exactly what A and B held when generation 1 stopped
    assert after["synced"]["C"]["checksum"] == before["stopped"]["A"]["checksum"]
    result = [json.loads(line) for line in (w.tmp / "A.log").read_text().splitlines()
              if line.startswith("{")][-1]
    assert result["final"] and result["samples"] == TOTAL


# ---------------------------------------------------------------------------- the store itself
def test_signed_store_reads_only_values_tagged_for_their_key() -> None:
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=5),
                           wait_for_workers=False)
    secret = "0123456789abcdef" * 2
    member = signed(server, secret, timeout_s=3.0)
    member.set("progress", '{"step": 5}')
    raw = dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=5))
    listed = raw.list_keys()
    assert listed == [namespace(secret) + "/progress"] and secret not in listed[0]
    assert member.get("progress") == b'{"step": 5}' and member.rejected == 0

    raw.set(listed[0], '{"step": 999}')                         # forged
    assert member.read("progress") is None and member.rejected == 1
    ns = namespace(secret) + "/"
    member.set("ev/1", "genuine")
    raw.set(ns + "ev/2", raw.get(ns + "ev/1"))                  # a genuine tag, another key
    assert member.read("ev/2") is None and member.read("missing") is None
    assert member.compare_set("cmd/0", "", "quit") == b"quit" and member.get("cmd/0") == b"quit"

    later = threading.Timer(0.3, lambda: member.set("ev/2", "real"))
    later.start()                                               # get() waits out a forgery
    assert member.get("ev/2") == b"real"
    other = SignedStore(dist.PrefixStore(namespace(secret), raw), "another secret", 1.0)
    with pytest.raises(RuntimeError, match="timeout"):
        other.get("ev/2")


def test_optimizer_skeleton_travels_as_json_with_its_types() -> None:
    skel = {"state": {0: {"step": {"__tensor__": 0, "shape": [], "dtype": "torch.float32",
                                   "device": "cpu"}}},
            "param_groups": [{"params": [0, 1], "betas": (0.9, 0.999), "lr": 0.1,
                              "eps": float("inf"), "foreach": None, "maximize": False,
                              "name": "g"}]}
    assert group._loads(group._dumps(skel)) == skel
    assert isinstance(group._loads(group._dumps(skel))["param_groups"][0]["betas"], tuple)
    with pytest.raises(TypeError):
        group._dumps({"bad": object()})
    with pytest.raises(ValueError):
        group._loads(b'{"__reduce__": 1}')
    with pytest.raises(ValueError):
        group._alloc({"__tensor__": 0, "shape": [2], "dtype": "torch.load", "device": "cpu"}, [])


# ---------------------------------------------------------------------------- no unpickling
RANK_SCRIPT = r"""
import hashlib, json, os, pickle, sys
from datetime import timedelta
import torch, torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from core.runtime import group
from core.runtime.checkpoint import Checkpoints

rank, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=30))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                        timeout=timedelta(seconds=30))
torch.manual_seed(rank)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
opt = torch.optim.Adam(model.parameters(), lr=0.1, betas=(0.8, 0.9))
step = 0
if rank == 1:                       # the most advanced rank: 5 steps, optimizer state to send
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
    step = 5

def tripwire(*args, **kwargs):
    raise AssertionError("unpickling during the state transfer")

for mod, name in [(pickle, "loads"), (pickle, "load"), (pickle, "Unpickler"), (torch, "load"),
                  (c10d, "_unpickler")]:
    setattr(mod, name, tripwire)
box = [{"claim": "most advanced"}] if rank == 1 else [None]
try:                                # the tripwire does catch the object broadcast
    dist.broadcast_object_list(box, src=1)
    caught = False
except AssertionError:
    caught = True
step, src, steps, restored = group.sync_state(model, opt, step, True, Checkpoints(None, 1e9),
                                              rank, 2, torch.device("cpu"), "gloo")
sd = opt.state_dict()
h = hashlib.sha256()
for t in list(model.state_dict().values()) + [v for s in sd["state"].values() for v in s.values()]:
    h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
print(json.dumps({"rank": rank, "caught": caught, "step": step, "src": src, "steps": steps,
                  "hash": h.hexdigest(), "keys": sorted(sd["state"]),
                  "betas": repr(sd["param_groups"][0]["betas"])}))
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)     # interpreter teardown after gloo can abort ("terminate called", ~1 in 30 runs under load)
"""


def test_state_sync_never_unpickles(tmp_path: Path) -> None:
    """Two real ranks sync state (rank 1 is ahead, with Adam state) while pickle.loads/load/
    Unpickler, torch.load and torch.distributed's own unpickler raise in both processes: the
    sync must succeed and leave both ranks with rank 1's model, optimizer state and step. Each
    rank first checks that the tripwire catches `broadcast_object_list` (what the sync used
    before), so the test fails if the state transfer goes back to unpickling."""
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30),
                           wait_for_workers=False)
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(server.port)], cwd=ROOT,
                              env=worker_env(GLOO_SOCKET_IFNAME="lo"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, out[-500:] + err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    r0, r1 = outs
    assert r0["caught"] and not r1["caught"]            # the receiver would have unpickled
    assert r0["step"] == r1["step"] == 5 and r0["src"] == r1["src"] == 1
    assert r0["steps"] == [0, 5] and r0["keys"] == r1["keys"] == [0, 1, 2, 3]
    assert r0["hash"] == r1["hash"] and r0["betas"] == r1["betas"] == "(0.8, 0.9)"


# ---------------------------------------------------------------------------- bind_host
def _listeners(port: int) -> set[str]:
    """Addresses with a socket listening on TCP `port`, from /proc/net/tcp and tcp6."""
    out = set()
    for name, width in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(addr)
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))   # host order
            out.add(str(ipaddress.ip_address(words)))
    return out


def test_bind_host_listens_only_on_that_address() -> None:
    coord = JobCoordinator("bind", GB, TOTAL, host="127.0.0.2", bind_host="127.0.0.2")
    anywhere = JobCoordinator("any", GB, TOTAL)
    try:
        port = coord.address[1]
        assert coord.address == ("127.0.0.2", port)
        assert _listeners(port) == {"127.0.0.2"}
        assert _listeners(anywhere.address[1]) & {"::", "0.0.0.0"}    # what the check tells apart
        socket.create_connection(("127.0.0.2", port), timeout=2).close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2)
        env = coord.worker_env("X")                    # a member reaches it through `host`
        client = signed(dist.TCPStore("127.0.0.2", port, None, False,
                                      timeout=timedelta(seconds=5)), env[P.ENV_SECRET])
        assert json.loads(client.get(P.META))["job"] == "bind"
        assert env[P.ENV_SECRET] not in json.dumps(coord.status())
    finally:
        coord.close(wait=False)
        anywhere.close(wait=False)
