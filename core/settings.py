"""What a harvester is built from, checked once. Every front end (the CLI, the replay page, the
benchmarks, the tests) puts its input into `HarvesterSettings.parse(...)` and hands the result to
`core.assemble.build`; an error is a `SettingsError` naming the setting by its path
(`replay.hours`, `live.dispatch`), which the front end words its own way (the CLI: its flags)."""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from .admission import DEFAULT_USER_MAX_JOBS
from .crashes import DEFAULT_CRASH_WINDOW_S
from .dispatchers.limits import DEFAULT_MAX_CHECKPOINT_GIB, DEFAULT_MAX_PIDS
from .controller_config import AUTO, QUEUE_ORDERS, ControllerConfig, parse_tfwd
from .errors import InputError, SettingsError
from .inventory import MAX_SLOTS
from .jpa import JPAConfig
from .listeners import Listener, check_listeners, web_listen
from .objective import OBJECTIVES
from .policies import POLICIES
from .registrations import DEFAULT_PER_DAY, DEFAULT_PER_MINUTE, RegistrationLimits
from .replay import CURVES, DATA, DEFAULT_JOBS, DEFAULT_TRACE, ReplaySettings
from .slots import MAX_SLOTS
from .pilots.settings import PilotSettings, split_list
from .transports.base import ENV_NAME
from .transports.runas import UNIX_NAME, RunAs

#: the choices and defaults front ends offer, from where they are defined
__all__ = ["AUTO", "CURVES", "DATA", "DEFAULT_JOBS", "DEFAULT_TRACE", "MAX_SLOTS", "OBJECTIVES", "POLICIES", "QUEUE_ORDERS",
           "SPEED_MAX", "SPEED_MIN", "ControllerConfig", "HarvesterSettings", "LiveSettings", "ReplaySettings",
           "SettingsError", "PilotSettings", "UNIX_NAME", "WorkerSettings", "check_speed", "parse_tfwd", "split_list",
           "Options", "OptionError", "Origin", "WebSettings", "Listener", "check_listeners", "web_listen"]

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
    rendezvous_timeout_s: float = 60.0   # a torchrun generation whose ranks form no group this long fails
    sample_s: float = 5.0            # seconds of one generation per throughput sample
    max_pids: int = DEFAULT_MAX_PIDS     # a job's processes on one node past this fail it (0: no cap)
    max_checkpoint_gib: float = DEFAULT_MAX_CHECKPOINT_GIB   # a job's checkpoint folder past this fails it (0: no cap)

    @field_validator("max_pids")
    @classmethod
    def _pids(cls, v: int) -> int:
        if not 0 <= v <= 4_194_304:
            raise SettingsError("", "must be a whole number from 0 (no cap) to 4194304")
        return v

    @field_validator("max_checkpoint_gib")
    @classmethod
    def _gib(cls, v: float) -> float:
        if not (math.isfinite(v) and 0 <= v <= 1_000_000):
            raise SettingsError("", "must be a number of GiB from 0 (no cap) to 1000000")
        return v

    @field_validator("crash_window_s")
    @classmethod
    def _window(cls, v: float) -> float:
        if not (math.isfinite(v) and 1 <= v <= 30 * 24 * 3600):
            raise SettingsError("", "must be a number of seconds from 1 to 2592000 (30 days)")
        return v

    @field_validator("heartbeat_timeout_s", "start_timeout_s", "rendezvous_timeout_s")
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
    source: Literal["static", "slurm", "pbs"] = "static"
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
    slurm: PilotSettings = PilotSettings()

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
        if self.uses_pilots:
            if self.dispatch not in (None, "pilot", "simulated"):
                raise SettingsError("dispatch", f"with {{source}} {self.source} each job's workers run inside the pilot "
                                                f"jobs: use {{dispatch}} pilot (or simulated), not {self.dispatch}")
            if self.local_nodes is not None or self.inventory is not None:
                raise SettingsError("source", f"{self.source} takes its nodes from the scheduler: leave out "
                                              "{local_nodes} and {inventory}")
            return self
        if self.dispatch is None:
            raise SettingsError("dispatch", "choose what runs the jobs: simulated, local or ssh")
        if self.dispatch == "pilot":
            raise SettingsError("dispatch", "pilot runs workers inside pilot jobs: it needs {source} slurm or pbs")
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
    def uses_pilots(self) -> bool:
        """Nodes come from a batch scheduler (Slurm, PBS), held by pilot jobs."""
        return self.source in ("slurm", "pbs")

    @property
    def dial_host(self) -> str:
        """The address nodes dial for the pilot hub, the jobs' stores and progress reports."""
        return self.advertise or "127.0.0.1"

    @property
    def bind_host(self) -> str:
        """Where the harvester's servers for the nodes listen (one interface, not all)."""
        return self.bind or self.dial_host

    @property
    def hub_on_bind(self) -> bool:
        """The Slurm pilot hub listens where the servers for the nodes do: --slurm-hub left at its
        default while --advertise or --bind is given (the one address story)."""
        return self.slurm.hub_host == PilotSettings.hub_host and bool(self.advertise or self.bind)

    @property
    def hub_host(self) -> str:
        """Where the Slurm pilot hub listens."""
        return self.bind_host if self.hub_on_bind else self.slurm.hub_host

    @property
    def dispatcher(self) -> Dispatch:
        return self.dispatch or "pilot"

    @property
    def real_workers(self) -> bool:
        """Jobs run real commands (not simulated progress, not a Slurm dry run)."""
        return self.dispatcher != "simulated" and not (self.uses_pilots and self.slurm.dry_run)

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
    user_jobs_per_minute: int = DEFAULT_PER_MINUTE  # registrations per user in any 60 s (staff exempt); 0: no limit
    user_jobs_per_day: int = DEFAULT_PER_DAY        # ... in any 24 h, cancelled ones too; 0: no limit

    @property
    def registration_limits(self) -> RegistrationLimits:
        return RegistrationLimits(self.user_jobs_per_minute, self.user_jobs_per_day)

    @field_validator("user_max_jobs", "user_jobs_per_minute", "user_jobs_per_day")
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


class WebSettings(_Settings):
    """The web tier (app.webconfig.WebConfig is built from these): cookies, sessions, waitress's
    threads and connections, the guard against slow clients. Named after their options."""
    secure_cookies: bool = False          # the login cookie over HTTPS only (a site behind TLS)
    session_idle: float = 8 * 3600        # seconds a browser session lasts unused
    session_max: float = 7 * 24 * 3600    # seconds a browser session lasts at most, however used
    threads: int = 8                      # waitress worker threads
    connection_limit: int = 500           # open connections at once, idle keep-alives included
    channel_timeout: int = 30             # seconds an idle connection stays open
    per_address_limit: int = 256          # connections one client address may hold (0: no cap)
    header_timeout: float = 10.0          # seconds a request's headers may take from its first byte
    metrics_interval: float = 5.0         # /metrics is rebuilt at most this often (0: on every scrape)
    metrics_token_file: Optional[Path] = None   # a file holding the bearer token /metrics asks for

    @field_validator("metrics_interval")
    @classmethod
    def _interval(cls, v: float) -> float:
        if not (math.isfinite(v) and 0 <= v <= 3600):
            raise SettingsError("", f"must be seconds from 0 (rebuilt on every scrape) to 3600, not {v:g}")
        return v

    @field_validator("threads", "connection_limit", "channel_timeout")
    @classmethod
    def _at_least_one(cls, v: int) -> int:
        if v < 1:
            raise SettingsError("", f"must be at least 1, not {v}")
        return v

    @field_validator("per_address_limit")
    @classmethod
    def _not_negative(cls, v: int) -> int:
        if v < 0:
            raise SettingsError("", f"must be at least 0, not {v}")
        return v

    @field_validator("session_idle", "session_max", "header_timeout")
    @classmethod
    def _positive(cls, v: float) -> float:
        if not (math.isfinite(v) and v > 0):
            raise SettingsError("", f"must be positive seconds, not {v:g}")
        return v

    @classmethod
    def parse(cls, data: dict[str, Any]) -> "WebSettings":
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise settings_error(e) from None


# ---------------------------------------------------------------------------------------------
# Options: every option of `python -m app`, from a configuration file, the environment and the
# command line (pydantic-settings merges them; the checks above judge the result).

ENV_PREFIX = "HARVEST_"
#: the users file's variable: HARVEST_USERS holds the accounts themselves (app.auth), not a path
USERS_FILE_ENV = "HARVEST_USERS_FILE"
#: tables a configuration file may group its keys in (cosmetic: `[web] threads` is `threads`;
#: in `[slurm]`, `partition` is `slurm_partition`)
GROUPS = ("server", "web", "replay", "live", "workers", "slurm", "pbs", "logging")
#: options a configuration file cannot hold (they are about the command itself)
NOT_IN_FILE = ("config",)
LOG_LEVELS = ("debug", "info", "warning", "error")
_D_SLURM = PilotSettings()
_D_WEB = WebSettings()


class OptionError(ValueError):
    """An option's value is wrong; the text names the option as it was given (`--port`,
    `HARVEST_PORT`, `harvest.toml: port`)."""

    def __init__(self, option: str, text: str) -> None:
        self.option = option
        super().__init__(text)


class Origin(BaseModel):
    """Where an option's value came from: a flag, a variable, the file (its key as written) or
    the default."""
    model_config = ConfigDict(frozen=True)
    kind: Literal["flag", "env", "file", "default"]
    name: str = ""                        # --port, HARVEST_PORT, web.threads (the file's key)
    file: str = ""

    def where(self) -> str:
        """The option as an error names it: `--port`, `HARVEST_PORT`, `harvest.toml: port`."""
        return f"{self.file}: {self.name}" if self.kind == "file" else self.name

    def describe(self) -> str:
        """For --print-config: `flag --port`, `env HARVEST_PORT`, `file harvest.toml (port)`, `default`."""
        if self.kind == "file":
            return f"file {self.file} ({self.name})"
        return f"{self.kind} {self.name}" if self.name else self.kind


class ConfigFile(PydanticBaseSettingsSource):
    """A TOML file of options named after their flags (`port = 8123`, `max_jobs = 10` or
    `max-jobs = 10`), optionally grouped in tables (GROUPS). An unknown key, a key given twice, a
    table within a table or a file that does not parse is an InputError naming the file (and
    the key, or the line)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Optional[Path]) -> None:
        super().__init__(settings_cls)
        self.path = Path(path) if path else None
        self.keys: dict[str, str] = {}        # option -> the key as the file writes it
        self.data: dict[str, Any] = self._read(self.path) if self.path else {}

    def _read(self, path: Path) -> dict[str, Any]:
        import tomllib
        try:
            raw = tomllib.loads(path.read_text())
        except OSError as e:
            raise InputError(str(path), None, f"cannot read the configuration file ({e.strerror or e})") from None
        except UnicodeDecodeError:
            raise InputError(str(path), None, "is not a UTF-8 text file") from None
        except tomllib.TOMLDecodeError as e:
            raise InputError(str(path), None, f"not valid TOML: {e}") from None
        fields = self.settings_cls.model_fields
        data: dict[str, Any] = {}
        for key, value in raw.items():
            if isinstance(value, dict):
                if key not in GROUPS:
                    raise InputError(str(path), None, f"[{key}]: unknown table; group keys in "
                                                      f"{', '.join(f'[{g}]' for g in GROUPS)}, or write them at the top")
                items = [(f"{key}.{k}", v, [f"{key}_{_key(k)}", _key(k)]) for k, v in value.items()]
            else:
                items = [(key, value, [_key(key)])]
            for written, v, names in items:
                name = next((n for n in names if n in fields and n not in NOT_IN_FILE), None)
                if isinstance(v, dict):
                    raise InputError(str(path), None, f"{written}: a table within a table; "
                                                      "one level of grouping at most")
                if name is None:
                    if names[-1] in NOT_IN_FILE:
                        hint = " (--config names the file on the command line or in HARVEST_CONFIG)"
                    else:
                        import difflib
                        near = difflib.get_close_matches(names[-1], [f for f in fields if f not in NOT_IN_FILE], 1)
                        hint = f" (did you mean {near[0]}?)" if near else ""
                    raise InputError(str(path), None, f"{written}: unknown setting{hint}")
                if name in data:
                    raise InputError(str(path), None, f"{written}: given twice (also as {self.keys[name]})")
                data[name], self.keys[name] = v, written
        return data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.data)


def _key(written: str) -> str:
    return written.strip().replace("-", "_")


class Environment(EnvSettingsSource):
    """HARVEST_<OPTION> (HARVEST_MAX_JOBS=4); the users file is HARVEST_USERS_FILE, since
    HARVEST_USERS holds the accounts themselves (app.auth reads it)."""

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        data.pop("users", None)
        if os.environ.get(USERS_FILE_ENV):
            data["users"] = os.environ[USERS_FILE_ENV]
        return data

    @staticmethod
    def name_of(option: str) -> str:
        return USERS_FILE_ENV if option == "users" else ENV_PREFIX + option.upper()


class Options(BaseSettings):
    """Every option of `python -m app`, flat and named after its flag (`--max-jobs` is
    `max_jobs`). Taken from, highest first: the command line, the environment (HARVEST_MAX_JOBS),
    the configuration file (--config FILE or HARVEST_CONFIG), the defaults here. This model
    checks each value's type (and the web tier's ranges, WebSettings); HarvesterSettings checks
    the rest, once the front end has put the options into its shape (app.__main__.settings_from).
    `Options.load(flags)` also records where each value came from (`origin`)."""
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True, env_ignore_empty=True,
                                      coerce_numbers_to_str=True, case_sensitive=False)

    config: Optional[Path] = None                # the configuration file itself (flag or HARVEST_CONFIG)
    # the service
    host: str = "127.0.0.1"
    port: int = 8050
    db: Path = Path("harvest.db")
    fresh: bool = False
    users: Optional[Path] = None
    secret_key: Optional[SecretStr] = None       # signs logins (no flag: a command line is public)
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    user_max_jobs: int = DEFAULT_USER_MAX_JOBS
    user_jobs_per_minute: int = DEFAULT_PER_MINUTE
    user_jobs_per_day: int = DEFAULT_PER_DAY
    tick: Optional[float] = None
    # replay
    scenario: Optional[Path] = None
    trace: Optional[Path] = None
    jobs: Optional[Path] = None
    node_list: Optional[Path] = None
    nodes: Optional[str] = None                  # replay: the first N nodes; live: the inventory file
    racks: Optional[str] = None
    start: Optional[str] = None
    hours: Optional[float] = None
    policy: Optional[str] = None
    objective: Optional[str] = None
    fair_half_life: Optional[float] = None
    tfwd: Optional[Union[float, str]] = None
    max_jobs: Optional[int] = None
    queue: Optional[str] = None
    visitor_slots: Optional[int] = None
    speed: Optional[float] = None
    curves: Optional[str] = None
    seed: Optional[int] = None
    gpus_per_node: Optional[int] = None
    # live
    dispatch: Optional[Dispatch] = None
    source: Literal["static", "slurm", "pbs"] = "static"
    local_nodes: Optional[int] = None
    local_slots: int = 1
    ssh_config: Optional[Path] = None
    workdir: str = ""
    advertise: str = ""
    bind: str = ""
    worker_env: str = ""
    run_as: str = ""
    trust_user_commands: bool = False
    profile_sizes: int = 3
    crash_window: float = DEFAULT_CRASH_WINDOW_S
    heartbeat_timeout: float = WorkerSettings().heartbeat_timeout_s
    start_timeout: float = WorkerSettings().start_timeout_s
    rendezvous_timeout: float = WorkerSettings().rendezvous_timeout_s
    job_max_pids: int = WorkerSettings().max_pids
    job_max_checkpoint_gib: float = WorkerSettings().max_checkpoint_gib
    no_profiler: bool = False
    # web server
    threads: int = _D_WEB.threads
    connection_limit: int = _D_WEB.connection_limit
    channel_timeout: int = _D_WEB.channel_timeout
    per_address_limit: int = _D_WEB.per_address_limit
    header_timeout: float = _D_WEB.header_timeout
    metrics_interval: float = _D_WEB.metrics_interval
    metrics_token_file: Optional[Path] = None
    session_idle: float = _D_WEB.session_idle
    session_max: float = _D_WEB.session_max
    secure_cookies: bool = _D_WEB.secure_cookies
    # Slurm
    slurm_partition: str = _D_SLURM.partition
    slurm_qos: str = ""
    slurm_account: str = ""
    slurm_max_pilots: int = _D_SLURM.max_pilots
    slurm_time_limit: int = _D_SLURM.time_limit_min
    slurm_watch: str = ""
    slurm_poll: float = _D_SLURM.poll_s
    slurm_batch: int = _D_SLURM.submit_batch
    slurm_submit_parallel: int = _D_SLURM.submit_parallel
    slurm_dry_run: bool = False
    slurm_hub: str = _D_SLURM.hub_host
    slurm_hub_max_connections: int = _D_SLURM.hub_max_connections
    slurm_advertise: str = ""
    slurm_conf: str = ""
    slurm_bin: str = ""
    slurm_python: str = _D_SLURM.python
    slurm_pilot_name: str = _D_SLURM.pilot_name
    slurm_pilot_logs: str = ""
    slurm_worker_grace: float = _D_SLURM.worker_grace_s
    slurm_slots: int = _D_SLURM.slots
    slurm_pending_timeout: float = _D_SLURM.pending_timeout_s
    slurm_release_grace: float = _D_SLURM.release_grace_s
    slurm_orphan_timeout: float = _D_SLURM.orphan_timeout_s
    slurm_backoff: float = _D_SLURM.backoff_s
    slurm_backoff_cap: float = _D_SLURM.backoff_cap_s
    slurm_submit_rate: int = _D_SLURM.submit_per_minute
    pbs_queue: str = _D_SLURM.partition
    pbs_account: str = ""
    pbs_conf: str = ""
    pbs_bin: str = ""

    _origins: dict[str, Origin] = PrivateAttr(default_factory=dict)

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        """Flags (init), then HARVEST_ variables, then the file; no .env file, no secrets folder."""
        env = Environment(settings_cls)
        path = getattr(init_settings, "init_kwargs", {}).get("config") or env().get("config")
        return init_settings, env, ConfigFile(settings_cls, path)

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        if not 0 <= v <= 65535:
            raise SettingsError("", f"must be a port number from 0 (any free port) to 65535, not {v}")
        return v

    @field_validator("tfwd", mode="before")
    @classmethod
    def _tfwd(cls, v: Any) -> Any:
        if v is None or isinstance(v, bool):
            return v
        try:
            return parse_tfwd(str(v))
        except ValueError:
            raise SettingsError("", f"give seconds or auto, not {v!r}") from None

    @field_validator("start", mode="before")
    @classmethod
    def _start(cls, v: Any) -> Any:
        """A TOML date-time (`start = 2021-02-10T20:00:00Z`) as ISO 8601 text."""
        return v.isoformat().replace("+00:00", "Z") if hasattr(v, "isoformat") else v

    @field_validator("worker_env", "slurm_watch", mode="before")
    @classmethod
    def _list(cls, v: Any) -> Any:
        """A list in the file (`worker_env = ["LD_LIBRARY_PATH", "NCCL_DEBUG"]`) as the flag's text."""
        return ",".join(str(x) for x in v) if isinstance(v, (list, tuple)) else v

    @field_validator("log_format", "log_level", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("threads", "connection_limit", "channel_timeout", "per_address_limit", "header_timeout",
                     "metrics_interval", "session_idle", "session_max")
    @classmethod
    def _web(cls, v: Any, info: Any) -> Any:
        try:
            WebSettings.parse({info.field_name: v})
        except SettingsError as e:
            raise SettingsError("", e.message) from None
        return v

    @classmethod
    def load(cls, flags: Optional[dict[str, Any]] = None) -> "Options":
        """The options from the flags given (`{"port": 8123}`; argparse's, of those on the
        command line only), the environment and the file. Raises InputError (the file cannot be
        read or holds an unknown key) or SettingsError whose field is the option and whose
        message names it by where it came from (`harvest.toml: port: ...`, `HARVEST_PORT: ...`)."""
        flags = {k: v for k, v in (flags or {}).items() if v is not None}
        env = Environment(cls)()
        path = flags.get("config") or env.get("config")
        file = ConfigFile(cls, path)
        origins = {}
        for name in cls.model_fields:
            if name in flags:
                origins[name] = Origin(kind="flag", name="--" + name.replace("_", "-"))
            elif name in env:
                origins[name] = Origin(kind="env", name=Environment.name_of(name))
            elif name in file.data:
                origins[name] = Origin(kind="file", name=file.keys[name], file=str(path))
            else:
                origins[name] = Origin(kind="default")
        try:
            opts = cls(**flags)
        except ValidationError as e:
            err = settings_error(e)
            option = err.field.split(".")[0]
            origin = origins.get(option, Origin(kind="default"))
            lead = origin.where() if origin.kind != "default" else option
            raise OptionError(option, f"{lead}: {SettingsError('', err.message).render()}") from None
        opts._origins = origins
        return opts

    def origin(self, option: str) -> Origin:
        return self._origins.get(option, Origin(kind="default"))

    @property
    def file(self) -> Optional[Path]:
        return self.config

    def web(self) -> WebSettings:
        """The web tier's settings (checked)."""
        return WebSettings.parse({k: getattr(self, k) for k in WebSettings.model_fields})

    def effective(self) -> list[tuple[str, Any, Origin]]:
        """Every option with its value (secrets masked) and where it came from, in declaration order."""
        out = []
        for name in type(self).model_fields:
            v = getattr(self, name)
            if isinstance(v, SecretStr):
                v = "********"
            out.append((name, v, self.origin(name)))
        return out
