"""Reading Slurm's output (core/slurm/parse.py) on what each version really printed: the files
under tests/data/slurm/<version>/ were recorded from running clusters of that version
(`python -m tests.support.record_slurm VERSION DIR`), text and JSON at the same moment, so the
text the harvester reads is checked against the JSON that version gives for the same nodes and
jobs (JSON whose shape changed from version to version: the forms node_state and job_state take)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.slurm.parse import (OLDEST, SlurmVersion, Unreadable, check_version, job_state, node_state,
                              parse_jobs, parse_nodes, parse_version)
from core.slurm.records import ENDED

DATA = Path(__file__).parent / "data" / "slurm"
RECORDED = sorted(p for p in DATA.iterdir() if p.is_dir())
#: the versions the issue names: each must have been recorded
REQUIRED = {"22.05", "24.11"}


def test_every_version_run_was_recorded():
    assert REQUIRED <= {p.name for p in RECORDED}, [p.name for p in RECORDED]


def json_nodes(d: Path) -> dict[str, dict]:
    """Nodes as this version's JSON has them: `scontrol show nodes --json` where it exists
    (23.02 on), else 22.05's `sinfo --json`."""
    for name in ("scontrol-nodes.json", "sinfo.json"):
        p = d / name
        if p.exists() and "nodes" in json.loads(p.read_text()):
            return {n["name"]: n for n in json.loads(p.read_text())["nodes"]}
    raise AssertionError(f"no JSON with nodes in {d}")


@pytest.fixture(params=RECORDED, ids=[p.name for p in RECORDED])
def recorded(request) -> Path:
    return request.param


def test_the_version_line_names_the_release_recorded(recorded):
    v = parse_version((recorded / "version.txt").read_text())
    assert f"{v.major}.{v.minor:02d}" == recorded.name
    check_version(v)


def test_nodes_read_from_text_agree_with_the_versions_own_json(recorded):
    nodes = parse_nodes((recorded / "sinfo.txt").read_text())
    assert len({n.name for n in nodes}) == len(nodes) > 0, "one record per node, all partitions in it"
    raw = json_nodes(recorded)
    assert {n.name for n in nodes} == set(raw)
    for n in nodes:
        j = raw[n.name]
        state = j["state"] if isinstance(j["state"], list) else [j["state"], *j.get("state_flags", [])]
        base, flags = node_state(state)
        assert (n.state, set(n.flags)) == (base, set(flags)), (n, j["state"], j.get("state_flags"))
        parts = j.get("partitions") or []
        assert set(n.partitions) == set(parts if isinstance(parts, list) else parts.split(",")), n
        assert n.gpus == (2 if "gpu:2" in str(j.get("gres", "")) else 0), (n, j.get("gres"))
        assert n.free == (base == "idle" and not flags), n
    states = {n.label for n in nodes}
    assert any(n.free for n in nodes) and any("drain" in n.flags for n in nodes), states
    assert any(not n.free and n.state in ("allocated", "mixed") for n in nodes), states


def test_jobs_read_from_text_agree_with_the_versions_own_json(recorded):
    jobs = {j.id: j for j in parse_jobs((recorded / "squeue.txt").read_text())}
    raw = {str(j["job_id"]): j for j in json.loads((recorded / "squeue.json").read_text())["jobs"]}
    assert jobs and set(jobs) <= set(raw)
    for jid, j in jobs.items():
        assert j.state == job_state(raw[jid]["job_state"]), (j, raw[jid]["job_state"])
        assert j.name == raw[jid]["name"]
    states = {j.state for j in jobs.values()}
    assert {"RUNNING", "PENDING"} <= states and states & ENDED, states
    assert all(j.nodes == "" for j in jobs.values() if j.state == "PENDING")
    failed = [j for j in jobs.values() if j.state == "FAILED"]
    assert failed and all(j.failed and j.reason == "NonZeroExitCode" for j in failed), failed


def test_states_in_every_form_slurm_prints_them():
    assert node_state("idle+planned") == ("idle", ("planned",))
    assert node_state(["IDLE", "DRAIN"]) == ("idle", ("drain",))
    assert node_state(["PLANNED", "IDLE"]) == ("idle", ("planned",)), "the base wherever it stands"
    assert node_state("idle*") == ("idle", ("not_responding",))
    assert node_state("mixed-") == ("mixed", ("planned",))
    assert node_state("IDLE+CLOUD+POWERED_DOWN") == ("idle", ("cloud", "powered_down"))
    assert node_state("alloc") == ("allocated", ())
    assert job_state(["RUNNING"]) == job_state("running") == "RUNNING"
    assert job_state(["CANCELLED", "COMPLETING"]) == "COMPLETING", "as squeue's %T shows it (24.11, recorded)"
    for bad in ("", [], "['RUNNING']"):
        with pytest.raises(Unreadable):
            (node_state if bad == "" else job_state)(bad)


def test_output_that_cannot_be_read_is_quoted_and_an_old_slurm_named():
    with pytest.raises(Unreadable, match="sinfo line 2 .*'node2 idle'"):
        parse_nodes("node1|idle|p|node1|(null)|\nnode2 idle\n")
    with pytest.raises(Unreadable, match="squeue line 1"):
        parse_jobs("12|RUNNING|node1\n")
    with pytest.raises(Unreadable, match="no version"):
        parse_version("sinfo: fatal: Could not establish a configuration source")
    with pytest.raises(Unreadable, match=r"Slurm 21\.08\.8 is older than 22\.05"):
        check_version(parse_version("slurm 21.08.8"))
    assert SlurmVersion(*OLDEST) <= parse_version("slurm-wlm 22.05.8") < parse_version("slurm 26.05.5")
