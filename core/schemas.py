"""Validation of everything that comes from outside: allocator instances, job sets, forms.

One set of rules (pydantic) for the CLI, the job-set loader and, later, the web form and REST
API, so that a job refused by one is refused by all with the same words.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import patterns
from .model import DEFAULT_PROGRESS_PATTERN, Curve


class CurveSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    nodes: list[int] = Field(min_length=1)
    samples_per_second: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _shape(self) -> "CurveSpec":
        if len(self.nodes) != len(self.samples_per_second):
            raise ValueError(f"curve has {len(self.nodes)} node counts but "
                             f"{len(self.samples_per_second)} throughputs")
        if any(n <= 0 for n in self.nodes):
            raise ValueError("curve node counts must be positive")
        if any(b <= a for a, b in zip(self.nodes, self.nodes[1:])):
            raise ValueError("curve node counts must be strictly increasing")
        if any(s < 0 for s in self.samples_per_second):
            raise ValueError("curve throughputs must be non-negative")
        if not any(s > 0 for s in self.samples_per_second):     # such a job never progresses
            raise ValueError("a curve must have a positive throughput at some size")
        return self

    def to_curve(self) -> Curve:
        return Curve(tuple(self.nodes), tuple(self.samples_per_second))


NAME_MAX = 100


class JobBounds(BaseModel):
    """Rules every job obeys wherever it is registered from."""

    model_config = ConfigDict(extra="forbid")

    min_nodes: int = Field(ge=1)
    max_nodes: int = Field(ge=1)
    scale_up_seconds: float = Field(default=18.0, ge=0)
    scale_down_seconds: float = Field(default=12.0, ge=0)
    priority: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) > max_nodes ({self.max_nodes})")
        return self


class InstanceJob(JobBounds):
    id: str = Field(min_length=1)
    curve: CurveSpec
    scale_up_seconds: float = Field(default=0.0, ge=0)
    scale_down_seconds: float = Field(default=0.0, ge=0)
    current_nodes: list[str] = Field(default_factory=list)
    fair: float = Field(default=1.0, gt=0, le=1)      # the owner's fair-share factor (objective fairshare)


class Instance(BaseModel):
    """The allocator command's input (see README: `python -m core.allocator`)."""

    model_config = ConfigDict(extra="forbid")

    tfwd: float = Field(default=10.0, gt=0)
    nodes: list[str] = Field(default_factory=list)
    jobs: list[InstanceJob] = Field(default_factory=list)
    objective: str = "throughput"

    @field_validator("objective")
    @classmethod
    def _objective(cls, v: str) -> str:
        from .objective import OBJECTIVES
        if v not in OBJECTIVES:
            raise ValueError(f"unknown objective {v!r}; choose one of {', '.join(OBJECTIVES)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Instance":
        seen: set[str] = set()
        for n in self.nodes:
            if n in seen:
                raise ValueError(f"node {n} listed twice")
            seen.add(n)
        ids: set[str] = set()
        owner: dict[str, str] = {}
        for j in self.jobs:
            if j.id in ids:
                raise ValueError(f"job id {j.id} used twice")
            ids.add(j.id)
            for n in j.current_nodes:
                if n not in seen:
                    raise ValueError(f"job {j.id}: current node {n} is not among the idle nodes")
                if n in owner:
                    raise ValueError(f"node {n} held by both {owner[n]} and {j.id}")
                owner[n] = j.id
        return self


class JobSetRow(JobBounds):
    """One line of a job-set CSV (data/jobs-*.csv)."""

    job: str = Field(min_length=1)
    model: str = ""
    submit_time: str
    total_samples: float = Field(gt=0)
    nodes: list[int]
    samples_per_second: list[float]
    owner: str = Field(default="", max_length=NAME_MAX)     # who the job is for (quotas, fair shares)

    @field_validator("owner")
    @classmethod
    def _owner(cls, v: str) -> str:
        if not v.isprintable():
            raise ValueError("must be printable text")
        return v

    @field_validator("nodes", "samples_per_second", mode="before")
    @classmethod
    def _split(cls, v):
        if isinstance(v, str):
            return [x for x in v.split(";") if x.strip() != ""]
        return v

    @model_validator(mode="after")
    def _curve(self) -> "JobSetRow":
        CurveSpec(nodes=self.nodes, samples_per_second=self.samples_per_second)
        return self

    def curve(self) -> Curve:
        return Curve(tuple(self.nodes), tuple(self.samples_per_second))


def explain(err: ValidationError, prefix: Optional[str] = None) -> str:
    """A pydantic error as short lines a person can act on: `where: what`."""
    lines = []
    for e in err.errors():
        where = ".".join(str(x) for x in e["loc"]) or "input"
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {msg}")
    text = "; ".join(lines)
    return f"{prefix}: {text}" if prefix else text


NODES_MAX = 100_000


def parse_curve_text(text: str) -> dict:
    """`1:1200, 8:9000` (nodes:samples/s pairs) as the form writes a curve, into CurveSpec input."""
    nodes, rates = [], []
    for part in (p.strip() for p in text.replace(";", ",").split(",")):
        if not part:
            continue
        n, sep, s = part.partition(":")
        if not sep:
            raise ValueError(f"{part!r} is not nodes:samples_per_second (e.g. 1:1200, 8:9000)")
        try:
            nodes.append(int(n.strip()))
            rates.append(float(s.strip()))
        except ValueError:
            raise ValueError(f"{part!r}: nodes must be a whole number and samples/s a number")
    if not nodes:
        raise ValueError("give at least one nodes:samples_per_second pair")
    return {"nodes": nodes, "samples_per_second": rates}


class JobSpec(BaseModel):
    """A job registered by a person, through the web form or `POST /api/jobs`: one set of rules
    for both, so that the form and the API refuse the same input with the same words."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=NAME_MAX)
    min_nodes: int = Field(ge=1, le=NODES_MAX)
    max_nodes: int = Field(ge=1, le=NODES_MAX)
    total_samples: float = Field(gt=0, le=1e15)
    curve: Optional[CurveSpec] = None       # none: the profiler learns it (real workers only)
    scale_up_seconds: float = Field(default=18.0, ge=0, le=3600)
    scale_down_seconds: float = Field(default=12.0, ge=0, le=3600)
    priority: float = Field(default=1.0, gt=0, le=1000)
    command: Optional[list[str]] = Field(default=None, min_length=1, max_length=256)
    global_batch: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    launcher: Literal["runtime", "torchrun"] = "runtime"
    progress_pattern: str = Field(default=DEFAULT_PROGRESS_PATTERN, min_length=1,
                                  max_length=patterns.PATTERN_MAX_CHARS)
    stop_grace_seconds: float = Field(default=30.0, ge=0, le=3600)
    samples_per_step: float = Field(default=0.0, ge=0, le=1e9)   # torchrun: > 0: the pattern counts steps

    @field_validator("progress_pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        """An RE2 pattern whose group 1 is the job's cumulative samples: matched in linear time
        on rank 0's output (core/patterns.py), so it is checked here for RE2's syntax and size."""
        return patterns.check(v)

    @field_validator("command", mode="before")
    @classmethod
    def _argv(cls, v):
        """A command is an argv list (each item passed literally, never through a shell), or a
        string split like a shell would split it."""
        if isinstance(v, str):
            import shlex
            try:
                v = shlex.split(v)
            except ValueError as e:
                raise ValueError(f"cannot split the command: {e}")
            if not v:
                return None
        if isinstance(v, list) and any(not isinstance(a, str) or "\x00" in a or len(a) > 4096 for a in v):
            raise ValueError("every argument must be text without NUL, at most 4096 characters")
        return v

    @field_validator("min_nodes", "max_nodes", "total_samples", "scale_up_seconds", "scale_down_seconds",
                     "priority", "global_batch", "stop_grace_seconds", "samples_per_step", mode="before")
    @classmethod
    def _not_bool(cls, v):
        if isinstance(v, bool):
            raise ValueError("must be a number, not true/false")
        return v

    @field_validator("name")
    @classmethod
    def _printable(cls, v: str) -> str:
        if not v.isprintable():
            raise ValueError("name must be printable text on one line")
        return v

    @field_validator("max_nodes")
    @classmethod
    def _max_at_least_min(cls, v: int, info) -> int:
        lo = info.data.get("min_nodes")
        if lo is not None and v < lo:
            raise ValueError(f"max nodes ({v}) must be at least min nodes ({lo})")
        return v

    @field_validator("curve", mode="before")
    @classmethod
    def _curve_text(cls, v):
        if isinstance(v, str):
            return parse_curve_text(v) if v.strip() else None
        return v


#: pydantic's error types in a person's words; `{…}` are the error's own limits
WORDS = {
    "missing": "is required",
    "int_parsing": "must be a whole number", "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number", "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "greater_than": "must be more than {gt}", "greater_than_equal": "must be at least {ge}",
    "less_than": "must be less than {lt}", "less_than_equal": "must be at most {le}",
    "string_type": "must be text", "string_too_long": "must be at most {max_length} characters",
    "list_type": "must be a list", "too_long": "must have at most {max_length} items",
    "extra_forbidden": "is not something a job has",
    "literal_error": "must be one of {expected}",
    "model_type": "must be an object", "model_attributes_type": "must be an object", "dict_type": "must be an object",
}


def _worded(e: dict) -> str:
    """One pydantic error as a person would say it, with the value given where that helps."""
    ctx, kind = e.get("ctx") or {}, e["type"]
    if kind == "value_error":
        return e["msg"].removeprefix("Value error, ")
    if kind == "string_too_short":
        return "must not be empty" if ctx.get("min_length") == 1 else f"needs at least {ctx.get('min_length')} characters"
    if kind == "too_short":
        return "must not be empty" if ctx.get("min_length") == 1 else f"needs at least {ctx.get('min_length')} items"
    words = WORDS.get(kind)
    if words is None:
        return e["msg"]
    text = words.format(**{k: (f"{v:g}" if isinstance(v, float) else v) for k, v in ctx.items()})
    given = e.get("input")
    if kind.endswith(("_parsing", "_type")) and isinstance(given, (str, int, float)) and len(repr(given)) <= 40:
        text += f", not {given!r}"
    return text


def field_errors(err: ValidationError) -> dict[str, str]:
    """Pydantic errors keyed by the top-level field they belong to (what a form shows beside
    it), worded for a person; a part of a field is named in front ("nodes[1]: ...")."""
    out: dict[str, str] = {}
    for e in err.errors():
        loc = e["loc"]
        where = str(loc[0]) if loc else "form"
        inner = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:]).lstrip(".")
        msg = _worded(e)
        if e["type"] == "extra_forbidden" and len(loc) > 1:
            inner, msg = "", f"unexpected key {loc[-1]}"
        out.setdefault(where, f"{inner}: {msg}" if inner else msg)
    return out
