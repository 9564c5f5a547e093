"""The one object a running process is organised around (see base.py), in a replay and a live
variant; front ends get one from `core.assemble.build` and use only what base.py offers."""
from .base import Capabilities, Conflict, Harvester, Unsupported
from .live import LiveHarvester
from .replay import ReplayHarvester
from ..registrations import TooManyRegistrations
from ..usage import BY as USAGE_BY, UsageReport

__all__ = ["Capabilities", "Conflict", "Harvester", "LiveHarvester", "ReplayHarvester", "TooManyRegistrations",
           "Unsupported", "USAGE_BY", "UsageReport"]
