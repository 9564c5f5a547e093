"""The Replay page's form, read on the server as typed: every field is checked (pydantic, then the
settings' own rules, then the trace and the job set) before the running replay is touched, and
each problem comes back in words beside its field, so a refused run never costs the current one."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from core.errors import InputError, SettingsError
from core.settings import DATA, MAX_SLOTS, POLICIES, SPEED_MAX, SPEED_MIN, ReplaySettings, parse_tfwd
from core.schemas import field_errors
from core.timeutil import parse_iso

#: the form's fields, in the order they are shown
FIELDS = ("start", "hours", "nodes", "racks", "gpus", "jobs", "policy", "tfwd", "speed")
Raw = Union[str, int, float, None]


class FormErrors(ValueError):
    """Field -> message, for every field the form must show an error beside."""

    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))


def jobsets() -> list[dict]:
    return [{"label": p.name, "value": str(p)} for p in sorted(DATA.glob("jobs-*.csv"))]


def _blank(v: Raw) -> bool:
    return v is None or (isinstance(v, str) and not v.strip())


def _number(v: Raw) -> float:
    try:
        x = float(str(v).strip()) if isinstance(v, str) else float(v)
    except (TypeError, ValueError):
        raise ValueError(f"type a number, not {v!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"type a finite number, not {v!r}")
    return x


def _whole(v: Raw, low: int, high: Optional[int] = None) -> Optional[int]:
    if _blank(v):
        return None
    x = _number(v)
    if not x.is_integer() or x < low or (high is not None and x > high):
        bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise ValueError(f"must be a whole number {bound}, not {v}")
    return int(x)


class ReplayForm(BaseModel):
    """The form as the browser sends it (numbers may arrive as text); blank means the default."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    start: Optional[str] = None
    hours: Optional[float] = None
    nodes: Optional[int] = None
    racks: Optional[str] = None
    gpus: Optional[int] = None
    jobs: str = ""
    policy: str = "milp"
    tfwd: Union[float, str, None] = None
    speed: float = 60.0

    @field_validator("start", mode="before")
    @classmethod
    def _start(cls, v: Raw) -> Optional[str]:
        if _blank(v):
            return None
        text = str(v).strip()
        try:
            parse_iso(text)
        except ValueError:
            raise ValueError(f"a date and time such as 2021-02-10T20:00:00Z (UTC), not {text!r}") from None
        return text

    @field_validator("hours", mode="before")
    @classmethod
    def _hours(cls, v: Raw) -> Optional[float]:
        if _blank(v):
            return None
        x = _number(v)
        if x <= 0:
            raise ValueError(f"the window must last more than 0 hours, not {v}")
        return x

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, v: Raw) -> Optional[int]:
        return _whole(v, 1)

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, v: Raw) -> Optional[int]:
        return _whole(v, 1, MAX_SLOTS)

    @field_validator("racks", mode="before")
    @classmethod
    def _racks(cls, v: Raw) -> Optional[str]:
        return None if _blank(v) else str(v).strip()

    @field_validator("jobs", mode="before")
    @classmethod
    def _jobs(cls, v: Raw) -> str:
        if v not in {o["value"] for o in jobsets()}:
            raise ValueError("choose one of the job sets in data/")
        return str(v)

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, v: Raw) -> str:
        if v not in POLICIES:
            raise ValueError(f"choose one of {', '.join(POLICIES)}")
        return str(v)

    @field_validator("tfwd", mode="before")
    @classmethod
    def _tfwd(cls, v: Raw) -> Union[float, str, None]:
        if _blank(v):
            return None
        try:
            t = parse_tfwd(v)
        except (TypeError, ValueError):
            raise ValueError(f"seconds (a number) or auto, not {v!r}") from None
        if isinstance(t, float) and not (math.isfinite(t) and t > 0):
            raise ValueError(f"must be more than 0 seconds, not {v}")
        return t

    @field_validator("speed", mode="before")
    @classmethod
    def _speed(cls, v: Raw) -> float:
        x = _number(v)
        if not SPEED_MIN <= x <= SPEED_MAX:
            raise ValueError(f"must be from {SPEED_MIN:g}x to {SPEED_MAX:g}x, not {v}")
        return x


#: a settings path (`replay.hours`, `config.tfwd`) -> the form field it belongs to
_FIELD_OF = {"start": "start", "hours": "hours", "nodes": "nodes", "racks": "racks", "gpus_per_node": "gpus",
             "jobs": "jobs", "policy": "policy", "tfwd": "tfwd", "speed": "speed"}


def parse(base: ReplaySettings, raw: dict[str, Raw],
          check: Callable[[ReplaySettings], None]) -> tuple[ReplaySettings, float]:
    """The new run's settings and speed; raises FormErrors naming every field that is wrong.
    `check` (the harvester's) reads the trace and the job set (about a second on Summit)."""
    try:
        form = ReplayForm.model_validate({k: raw.get(k) for k in FIELDS if k in raw})
    except ValidationError as e:
        raise FormErrors(field_errors(e)) from None
    try:
        config = replace(base.config, policy=form.policy,
                         tfwd=form.tfwd if form.tfwd is not None else base.config.tfwd)
        settings = replace(base, jobs=Path(form.jobs), start=form.start, hours=form.hours, nodes=form.nodes,
                           racks=form.racks, config=config, gpus_per_node=form.gpus)
        check(settings)
    except SettingsError as e:
        field = _FIELD_OF.get(e.field.rsplit(".", 1)[-1], "form")
        raise FormErrors({field: e.render(lambda path: path.rsplit(".", 1)[-1]).split(": ", 1)[-1]}) from None
    except (InputError, ValueError) as e:
        raise FormErrors({"form": str(e)}) from None
    return settings, form.speed
