"""Worker keys and places of ranks on multi-slot nodes (core/runtime/ranks.py)."""
from __future__ import annotations

import pytest

from core.runtime import ranks


def test_one_slot_nodes_keep_their_node_name_as_key():
    assert ranks.keys_of("a01n02", 1) == ["a01n02"]
    assert ranks.node_of("a01n02") == "a01n02" and ranks.slot_of("a01n02") == 0


def test_slot_keys_round_trip():
    keys = ranks.keys_of("gpu-3.x", 4)
    assert keys == ["gpu-3.x:0", "gpu-3.x:1", "gpu-3.x:2", "gpu-3.x:3"]
    assert [ranks.slot_of(k) for k in keys] == [0, 1, 2, 3]
    assert {ranks.node_of(k) for k in keys} == {"gpu-3.x"}
    with pytest.raises(ValueError):
        ranks.worker_key("n", 2, 2)


def test_places_follow_the_members_list():
    members = ranks.keys_of("b", 2) + ranks.keys_of("a", 2) + ["c"]
    p = ranks.place(members, "a:1")
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size, p.node_rank, p.nodes) == (3, 5, 1, 2, 1, 3)
    assert p.env() == {"RANK": "3", "WORLD_SIZE": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                       "NODE_RANK": "1", "GROUP_RANK": "1"}
    c = ranks.place(members, "c")
    assert (c.rank, c.local_rank, c.local_world_size, c.node_rank) == (4, 0, 1, 2)
    assert ranks.nodes_of(members) == ["b", "a", "c"]


def test_a_rank_left_alone_keeps_its_device_slot():
    p = ranks.place(["x:0", "y:1"], "y:1")
    assert (p.local_rank, p.local_world_size, p.node_rank) == (1, 1, 1)
    with pytest.raises(ValueError):
        ranks.place(["x:0"], "y:0")
