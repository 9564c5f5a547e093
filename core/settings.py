"""What a harvester is built from, checked once. Every front end (the CLI, the replay page, the
benchmarks, the tests) puts its input into `HarvesterSettings.parse(...)` and hands the result to
`core.assemble.build`; an error is a `SettingsError` naming the setting by its path
(`replay.hours`, `live.dispatch`), which the front end words its own way (the CLI: its flags)."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from .admission import DEFAULT_USER_MAX_JOBS
from .crashes import DEFAULT_CRASH_WINDOW_S
from .controller import AUTO, QUEUE_ORDERS, ControllerConfig, parse_tfwd
from .errors import SettingsError
from .inventory import MAX_SLOTS
from .jpa import JPAConfig
from .policies import POLICIES
from .replay import CURVES, DATA, DEFAULT_JOBS, DEFAULT_TRACE, ReplaySettings
from .slots import MAX_SLOTS
from .slurm.settings import SlurmSettings, split_list
from .transports.base import ENV_NAME
from .transports.runas import UNIX_NAME, RunAs

#: the choices and defaults front ends offer, from where they are defined
__all__ = ["AUTO", "CURVES", "DATA", "DEFAULT_JOBS", "DEFAULT_TRACE", "MAX_SLOTS", "POLICIES", "QUEUE_ORDERS",
           "SPEED_MAX", "SPEED_MIN", "ControllerConfig", "HarvesterSettings", "LiveSettings", "ReplaySettings",
           "SettingsError", "SlurmSettings", "UNIX_NAME", "WorkerSettings", "check_speed", "parse_tfwd", "split_list"]

SPEED_MIN, SPEED_MAX = 1.0, 3600.0
#: a host name or an IPv4/IPv6 address (no port, no spaces)
HOST = re.compile(r"^[A-Za-z0-9_.:-]+$")
Dispatch = Literal["simulated", "local", "ssh", "pilot"]


def check_speed(speed: float) -> float:
    """A replay's speed (simulated seconds per wall second) within the range the runner keeps up with."""
    try:
        speed = float(speed)
    except (TypeError, ValueError):
        raise SettingsError("speed", f"must be a number, not {speed!r}") from None
    if not (math.isfinite(speed) and SPEED_MIN <= speed <= SPEED_MAX):
        raise SettingsError("speed", f"must be between {SPEED_MIN:g}x and {SPEED_MAX:g}x")
    return speed


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class WorkerSettings(_Settings):
    """How real workers are handled: the grace they get, when a lost node is offered again, when
    a job with crashing workers fails, and how long a throughput sample for the profiler is."""
    stop_grace_s: float = 5.0        # a dismissed or stopped worker: SIGTERM, SIGKILL after this
    vacate_grace_s: float = 1.0      # a worker on a node the owner took back
    rejoin_after_s: float = 5.0      # a node whose worker was lost is offered again after this
    max_crashes: int = 3             # lost workers within crash_window_s after which the job fails
    crash_window_s: float = DEFAULT_CRASH_WINDOW_S   # losses older than this no longer count
    heartbeat_timeout_s: float = 15.0  # a worker silent this long (hung, stopped) loses its node
    start_timeout_s: float = 300.0   # a job holding nodes with no step (progress line) this long fails
    sample_s: float = 5.0            # seconds of one generation per throughput sample

    @field_validator("crash_window_s")
    @classmethod
    def _window(cls, v: float) -> float:
        if not (math.isfinite(v) and 1 <= v <= 30 * 24 * 3600):
            raise SettingsError("", "must be a number of seconds from 1 to 2592000 (30 days)")
        return v

    @field_validator("heartbeat_timeout_s", "start_timeout_s")
    @classmethod
    def _heartbeat(cls, v: float) -> float:
        if not (math.isfinite(v) and 1 <= v <= 3600):
            raise SettingsError("", "must be a number of seconds from 1 to 3600")
        return v

    @field_validator("stop_grace_s", "vacate_grace_s", "rejoin_after_s", "sample_s")
    @classmethod
    def _seconds(cls, v: float) -> float:
        if not (math.isfinite(v) and 0 <= v <= 3600):
            raise SettingsError("", "must be a number of seconds from 0 to 3600")
        return v

    @field_validator("max_crashes")
    @classmethod
    def _crashes(cls, v: int) -> int:
        if v < 1:
            raise SettingsError("", "must be at least 1")
        return v


class LiveSettings(_Settings):
    """Live mode: where idle nodes come from and what runs the jobs, in wall time."""
    source: Literal["static", "slurm"] = "static"
    dispatch: Optional[Dispatch] = None          # None: pilot with the Slurm source
    local_nodes: Optional[int] = None            # static source: this many local 'nodes'
    local_slots: int = 1                         # ranks (GPUs) per local node
    inventory: Optional[Path] = None             # static source: hostname, ssh target, slots per line
    ssh_config: Optional[Path] = None
    workdir: str = ""                            # workers' working directory on the nodes
    report_url: Optional[str] = None             # where workers post progress (the app's /api/workers)
    advertise: str = ""                          # the address nodes reach this host at: hub, stores, reports
    bind: str = ""                               # where those servers listen (default: advertise)
    worker_env: tuple[str, ...] = ()             # this process's variables workers also get (a site's)
    run_as: str = ""                             # launcher prefix running a job as its owner ({user}, {env})
    trust_user_commands: bool = False            # unmapped users' commands may run as the harvester
    profiler: bool = True                        # learn curves on real workers (else take them as given)
    profile_sizes: int = 3                       # sizes a new job is measured at whatever it costs
    config: ControllerConfig = ControllerConfig()
    workers: WorkerSettings = WorkerSettings()
    slurm: SlurmSettings = SlurmSettings()

    @field_validator("local_nodes")
    @classmethod
    def _at_least_one(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v < 1:
            raise SettingsError("", "must be at least 1")
        return v

    @field_validator("local_slots")
    @classmethod
    def _slots(cls, v: int) -> int:
        if not 1 <= v <= MAX_SLOTS:
            raise SettingsError("", f"must be a whole number from 1 to {MAX_SLOTS}")
        return v

    @field_validator("advertise", "bind")
    @classmethod
    def _host(cls, v: str) -> str:
        v = v.strip()
        if v and not HOST.match(v):
            raise SettingsError("", f"give a host name or an IP address, not {v!r}")
        return v

    @field_validator("worker_env")
    @classmethod
    def _env_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not ENV_NAME.match(name):
                raise SettingsError("", f"{name!r} is not an environment variable name")
            if name.startswith("HARVEST_"):
                raise SettingsError("", f"{name}: the harvester's own variables never go to workers")
        return v

    @field_validator("run_as")
    @classmethod
    def _launcher(cls, v: str) -> str:
        if v.strip():
            try:
                RunAs.parse(v)
            except ValueError as e:
                raise SettingsError("", str(e).replace("{", "{{").replace("}", "}}")) from None
        return v.strip()

    @field_validator("profile_sizes")
    @classmethod
    def _not_negative(cls, v: int) -> int:
        if v < 0:
            raise SettingsError("", "must be 0 or more")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "LiveSettings":
        if self.source == "slurm":
            if self.dispatch not in (None, "pilot", "simulated"):
                raise SettingsError("dispatch", "with {source} slurm each job's workers run inside the pilot "
                                                f"jobs: use {{dispatch}} pilot (or simulated), not {self.dispatch}")
            if self.local_nodes is not None or self.inventory is not None:
                raise SettingsError("source", "slurm takes its nodes from Slurm: leave out {local_nodes} "
                                              "and {inventory}")
            if self.run_as:
                raise SettingsError("run_as", "jobs in Slurm pilots run as the pilot's user: {run_as} is for "
                                              "{dispatch} local and ssh (leave it out; without it only staff, or "
                                              "everyone with {trust_user_commands}, may run commands)")
            return self
        if self.dispatch is None:
            raise SettingsError("dispatch", "choose what runs the jobs: simulated, local or ssh")
        if self.dispatch == "pilot":
            raise SettingsError("dispatch", "pilot runs workers inside Slurm pilot jobs: it needs {source} slurm")
        if self.local_nodes is not None and self.inventory is not None:
            raise SettingsError("local_nodes", "give either {local_nodes} or {inventory}, not both")
        if self.local_slots != 1 and self.local_nodes is None:
            raise SettingsError("local_slots", "{local_slots} is for {local_nodes}; an inventory gives slots per node")
        if self.local_nodes is None and self.inventory is None:
            raise SettingsError("local_nodes", "live mode needs {local_nodes} N or {inventory} FILE")
        if self.dispatch == "ssh" and self.inventory is None:
            raise SettingsError("inventory", "{dispatch} ssh needs a node file (hostname, ssh target, slots)")
        return self

    @property
    def dial_host(self) -> str:
        """The address nodes dial for the pilot hub, the jobs' stores and progress reports."""
        return self.advertise or "127.0.0.1"

    @property
    def bind_host(self) -> str:
        """Where the harvester's servers for the nodes listen (one interface, not all)."""
        return self.bind or self.dial_host

    @property
    def dispatcher(self) -> Dispatch:
        return self.dispatch or "pilot"

    @property
    def real_workers(self) -> bool:
        """Jobs run real commands (not simulated progress, not a Slurm dry run)."""
        return self.dispatcher != "simulated" and not (self.source == "slurm" and self.slurm.dry_run)

    @property
    def launcher(self) -> Optional[RunAs]:
        """The prefix that runs a job as its owner's account; None: jobs run as the harvester."""
        return RunAs.parse(self.run_as) if self.run_as else None

    @property
    def jpa(self) -> Optional[JPAConfig]:
        """The profiler's settings: on real workers unless turned off (simulated jobs run at the
        curve they are given, so there is nothing to learn)."""
        return JPAConfig.live(self.profile_sizes) if (self.profiler and self.real_workers) else None


class HarvesterSettings(_Settings):
    """Everything `core.assemble.build` needs: a replay (the default) or a live harvester."""
    db: Path = Path("harvest.db")
    fresh: bool = False                          # start over even if the store holds a run
    tick_s: Optional[float] = None               # None: 0.5 s replay, 0.2 s live
    replay: Optional[ReplaySettings] = None
    speed: float = 60.0                          # replay: simulated seconds per wall second
    live: Optional[LiveSettings] = None
    user_max_jobs: int = DEFAULT_USER_MAX_JOBS    # queued + running jobs per user (staff exempt); 0: no limit

    @field_validator("user_max_jobs")
    @classmethod
    def _quota(cls, v: int) -> int:
        if not 0 <= v <= 1_000_000:
            raise SettingsError("", "must be a whole number from 0 (no limit) to 1000000")
        return v

    @field_validator("speed")
    @classmethod
    def _speed(cls, v: float) -> float:
        try:
            return check_speed(v)
        except SettingsError as e:
            raise SettingsError("", e.message) from None

    @field_validator("tick_s")
    @classmethod
    def _tick(cls, v: Optional[float]) -> Optional[float]:
        if v is not None and not (math.isfinite(v) and 0 < v <= 60):
            raise SettingsError("", "must be a number of seconds in (0, 60]")
        return v

    @model_validator(mode="after")
    def _one_mode(self) -> "HarvesterSettings":
        if self.replay is not None and self.live is not None:
            raise SettingsError("live", "a harvester replays a trace or runs live, not both")
        return self

    @property
    def tick(self) -> float:
        return self.tick_s or (0.2 if self.live is not None else 0.5)

    @property
    def replay_settings(self) -> ReplaySettings:
        return self.replay if self.replay is not None else ReplaySettings()

    @classmethod
    def parse(cls, data: dict[str, Any]) -> "HarvesterSettings":
        """Validate `data`; raises SettingsError for the first problem, named by its path."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise settings_error(e) from None


def settings_error(e: ValidationError) -> SettingsError:
    """The first error of a validation as a SettingsError with the setting's whole path."""
    err = e.errors()[0]
    # a union's member (tfwd: seconds or "auto") is named in the path; the setting is what counts
    loc = ".".join(str(p) for p in err["loc"]
                   if not isinstance(p, int) and p != "float" and not str(p).startswith("literal["))
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, SettingsError):
        return cause.within(loc) if loc else cause
    if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        return SettingsError(loc, "unknown setting")
    return SettingsError(loc, err["msg"])
