"""The test daemons' ports (tests/support/ports.py) lie outside the kernel's ephemeral range, so no
outgoing connection or `bind(0)` elsewhere in the suite can take one before its daemon binds it."""
from __future__ import annotations

import socket

from tests.support import ports
from tests.support.ports import ephemeral_range, free_port, free_ports


def test_ports_are_distinct_free_and_outside_the_ephemeral_range():
    low, high = ephemeral_range()
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(not low <= p <= high for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("", p))


def test_a_port_in_use_is_passed_over(monkeypatch):
    taken = free_port()
    with socket.socket() as holder:
        holder.bind(("", taken))
        holder.listen()
        monkeypatch.setattr(ports.random, "sample", lambda pool, k: [taken, *(q for q in pool if q != taken)][:k])
        chosen = free_port()
    assert chosen != taken and chosen in ports._pool()
