"""What a controller is told to do: policy, solver, objective, horizon (seconds or learned), the
running-job limit and queue order, the demo lane. Checked once here, so a bad value is one clear
error at start instead of a surprise mid-run."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Union

from .errors import SettingsError
from .fairshare import DEFAULT_HALF_LIFE_S
from .objective import OBJECTIVES
from .policies import POLICIES, SOLVERS

QUEUE_ORDERS = ("fcfs", "priority", "fairshare")
#: `tfwd` may be this instead of seconds: learn the horizon from the idle fragments (core.horizon)
AUTO = "auto"


def parse_tfwd(text: object) -> Union[float, str]:
    """T_fwd as a person types it (a flag, a form field): seconds, or `auto`. Raises ValueError;
    ControllerConfig checks the number."""
    if isinstance(text, str) and text.strip().lower() == AUTO:
        return AUTO
    return float(text)  # type: ignore[arg-type]


@dataclass
class ControllerConfig:
    policy: str = "milp"
    solver: str = "dp"
    objective: str = "throughput"
    tfwd: Union[float, Literal["auto"]] = AUTO     # learned per job and decision (core.horizon)
    max_jobs: int = 10
    queue: str = "fcfs"
    time_limit: float = 5.0
    #: the demo lane: running slots beyond max_jobs that only registered jobs (not the job set's)
    #: may take; such jobs also go first in the queue and are given nodes first (0: no lane)
    visitor_slots: int = 0
    #: objective fairshare: seconds after which an owner's use counts half (core.fairshare)
    fair_half_life: float = DEFAULT_HALF_LIFE_S

    def __post_init__(self) -> None:
        for name, allowed in (("policy", POLICIES), ("solver", SOLVERS), ("objective", OBJECTIVES),
                              ("queue", QUEUE_ORDERS)):
            if getattr(self, name) not in allowed:
                raise SettingsError(name, f"unknown {name} {getattr(self, name)!r}; choose one of "
                                          f"{', '.join(allowed)}")
        if isinstance(self.tfwd, str) and self.tfwd.strip().lower() == AUTO:
            self.tfwd = AUTO
        for name in ("tfwd", "time_limit", "fair_half_life") if self.tfwd != AUTO else ("time_limit", "fair_half_life"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise SettingsError(name, f"must be a positive number of seconds{' or auto' if name == 'tfwd' else ''}, "
                                          f"not {v!r}")
        if isinstance(self.max_jobs, bool) or not isinstance(self.max_jobs, int) or self.max_jobs < 1:
            raise SettingsError("max_jobs", f"must be a whole number of at least 1, not {self.max_jobs!r}")
        v = self.visitor_slots
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 100:
            raise SettingsError("visitor_slots", f"must be a whole number from 0 to 100, not {v!r}")

    @property
    def learns_horizon(self) -> bool:
        """T_fwd is learned from the idle fragments rather than fixed."""
        return self.tfwd == AUTO
