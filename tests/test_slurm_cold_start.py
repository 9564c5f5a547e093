"""A cold start on 128 real slurmd (issue 48): the harvester with default settings holds every
idle node with a pilot, and one job that can use them all holds all the held nodes within a
minute of the last pilot connecting; the learned horizon is not shortened by the arrivals.
Issue 56 (9.): this failed about one run in four under the suite's load while joins were let
through after a 10 s quiet gap; they now wait until no pilot is starting.

Before the fix, on 256 slurmd, such a job stayed on 16 nodes for minutes: the pilots connect one
by one, each join grew the job, and each grow ended a "stand" of a few ms, so the horizon learned
0.5 s and no grow paid after that (core/horizon.py: a grow folded into the regroup under way
ends no stand). Joins that arrive while more pilots are starting now reach the controller
together (core/pilots/joins.py, JoinHold), and healthy pilots are not held to the failure rate
cap (core/pilots/book.py: 120 a minute kept the last 8 of 128 pilots a minute late).

The host's Slurm (22.05) alone: what is tested is the harvester's pace, not a Slurm version's."""
from __future__ import annotations

import re
import time
from typing import Iterator

import pytest

from core.horizon import FALLBACK_S
from core.model import Event, EventKind
from core.pilots.joins import JoinHold
from tests.support.server import start_app
from tests.support.slurm import HOST_VERSION, SlurmCluster, start_cluster
from tests.support.waiting import wait

NODES = 128
#: the job's rescale costs, as in the issue: a grow pauses it 18 s, a shrink 12 s
UP_S, DOWN_S = 18, 12
HELD = re.compile(r"^(\d+) node\(s\) held by pilots")


@pytest.fixture(scope="module")
def big_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """128 slurmd without GPUs (the simulated dispatcher runs no rank), started and stopped as
    the shared fixture does; nothing may be left running in the namespace."""
    cluster = start_cluster(tmp_path_factory.mktemp("slurm-cold"), nodes=NODES, gpus=0, version=HOST_VERSION)
    try:
        yield cluster
    finally:
        left = cluster.stop()
        assert not left, f"left running in the Slurm namespace after stop: {left}"


def join(node: str) -> Event:
    return Event(0.0, EventKind.NODE_JOIN, node=node)


def leave(node: str) -> Event:
    return Event(0.0, EventKind.NODE_LEAVE, node=node)


BURSTS = {"a": 1, "b": 1, "c": 1, "d": 2, "x": 1}


def burst(node: str) -> int:
    """Nodes named n*/last went with burst 1, m* with burst 2, s* alone each (3, 4, ...)."""
    if node in BURSTS:
        return BURSTS[node]
    return 2 if node.startswith("m") else 3 + int(node[1:]) if node.startswith("s") else 1


def test_joins_wait_for_their_burst_and_leaves_never_wait() -> None:
    h = JoinHold(cap_s=60.0)
    assert h.pass_on([join("a"), join("b")], 0.0, {1}, burst) == []
    assert h.pass_on([leave("b"), leave("x")], 1.0, {1}, burst) == [leave("b"), leave("x")]
    assert h.pass_on([join("c")], 2.0, set(), burst) == [join("a"), join("c")], "b left before it joined"
    assert h.held == [] and h.since == {}
    assert h.pass_on([join("d")], 3.0, set(), burst) == [join("d")], "nothing starting: a join goes at once"
    assert h.pass_on([join("q")], 3.0, {1}, lambda node: None) == [join("q")], "an adopted pilot: never held"


def test_a_slow_cold_start_is_held_until_no_pilot_of_it_is_starting_up_to_the_cap() -> None:
    """128 pilots on 2 loaded cores connected over more than 30 s, the last 16 more than 10 s
    after the others; a quiet gap between joins let the first 112 through alone (seen in CI:
    the job then stayed on 112 of 128 nodes)."""
    h = JoinHold(cap_s=60.0)
    for t in range(0, 45, 5):                       # a join every 5 s for 40 s: all held
        assert h.pass_on([join(f"n{t}")], float(t), {1}, burst) == []
    assert h.pass_on([], 58.0, {1}, burst) == [], "a 18 s gap while pilots are starting: still held"
    assert [e.node for e in h.pass_on([join("last")], 59.0, set(), burst)] == \
        [f"n{t}" for t in range(0, 45, 5)] + ["last"]
    for t in range(0, 60, 5):
        assert h.pass_on([join(f"m{t}")], 100.0 + t, {2}, burst) == []
    assert len(h.pass_on([join("m60")], 160.0, {2}, burst)) == 13, "never past the cap"


def test_on_a_whole_machine_a_node_freed_alone_joins_once_its_own_pilot_is_in() -> None:
    """Issue 59: at 10,624 nodes some pilot is always starting; a join held while any pilot
    started waited up to the cap (hello -> allocation p99 27 s). Only its own burst counts."""
    h = JoinHold(cap_s=60.0)
    assert h.pass_on([join("n1")], 0.0, {1}, burst) == [], "a big burst under way"
    for k in range(1, 20):                           # single nodes freed while it goes on
        assert h.pass_on([join(f"s{k}")], float(k), {1, 3 + k + 1}, burst) == [join(f"s{k}")]
    assert h.pass_on([join("n2")], 30.0, set(), burst) == [join("n1"), join("n2")]


def test_a_cold_start_on_128_nodes_gives_the_job_every_held_node_within_a_minute(big_cluster, tmp_path):
    cluster = big_cluster
    cluster.wait_quiet()
    app = start_app(tmp_path / "app", "--source", "slurm", *cluster.app_args(), "--dispatch", "simulated",
                    "--slurm-max-pilots", str(NODES))
    try:
        status, job = app.request("POST", "/api/jobs", {
            "name": "linear to 128", "min_nodes": 1, "max_nodes": NODES, "total_samples": 10**12,
            "curve": f"1:100, {NODES}:{100 * NODES}", "scale_up_seconds": UP_S, "scale_down_seconds": DOWN_S},
            token=app.token("alice"))
        assert status == 201, job
        seen: list[tuple[float, int, int, dict]] = []     # (t, held by pilots, held by the job, horizon)
        t0 = time.monotonic()

        def all_used() -> bool:
            c = app.get("/api/cluster?nodes=0")[1]
            m = HELD.match(c["source"]["detail"])
            nodes = app.get(f"/api/jobs/{job['id']}")[1]["nodes"]
            seen.append((time.monotonic() - t0, int(m.group(1)) if m else 0, nodes, c["config"]["horizon"]))
            return seen[-1][1] == NODES and nodes == NODES

        wait(all_used, 150, "the job on all 128 nodes", lambda: seen[-3:], period=0.25)
        last_pilot = min(t for t, held, _, _ in seen if held == NODES)
        used = seen[-1][0]
        print(f"all {NODES} pilots connected {last_pilot:.1f} s after the job was registered; the job held "
              f"them all {used - last_pilot:.1f} s later; horizon {[round(h['tfwd'], 1) for *_, h in seen[::8]]}")
        assert used - last_pilot <= 60.0, f"the job held all nodes {used - last_pilot:.1f} s after the last pilot"
        tfwd = [h["tfwd"] for *_, h in seen]
        assert min(tfwd) >= FALLBACK_S, f"arrivals shortened the horizon: {tfwd}"
        assert tfwd == sorted(tfwd), f"the horizon fell while nodes arrived: {tfwd}"
        assert all(h["stands"] == 0 for *_, h in seen), "a grow onto arriving nodes ended a stand"
    finally:
        app.stop()
    wait(lambda: not [j for j in cluster.jobs().values() if j["name"] == "harvest-pilot"
                      and j["job_state"] in ("RUNNING", "PENDING", "COMPLETING")],
         60, "every pilot ended once the harvester stopped")
