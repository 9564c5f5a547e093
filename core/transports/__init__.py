"""Start and stop one worker process on a node: `Transport` with a local and an SSH backend.
See base.py for the contract; the dispatcher decides what runs where, a transport only runs it."""
from __future__ import annotations

from .base import (STOP_GONE, STOP_KILL, STOP_LOST, STOP_TERM, Handle, NodeSpec, StartError,
                   Transport, TransportError)
from .local import LocalTransport
from .ssh import SshTransport

__all__ = ["Handle", "LocalTransport", "NodeSpec", "SshTransport", "StartError", "Transport",
           "TransportError", "STOP_GONE", "STOP_KILL", "STOP_LOST", "STOP_TERM"]
