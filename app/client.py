"""A Python client for the harvester's JSON API (`/api`, see app/api.py and the README).

Standard library only and no import of the rest of this repository, so that a user's script
can copy this one file next to itself and needs nothing installed:

    from app.client import ApiError, Client

    api = Client.login("http://head01:8050", "alice", "...")
    job = api.submit(name="digits", min_nodes=1, max_nodes=4, total_samples=640_000, global_batch=64,
                     command=["python", "examples/digits_cnn.py", "--lr", "0.1"])
    print(api.wait(job["id"], timeout=3600)["state"])          # done, failed or cancelled

Every refusal by the server, and a server that cannot be reached, raises `ApiError`; a job the
server refuses carries the server's message per field in `ApiError.field_errors`, the same
words the dashboard's form shows beside each field. `wait(..., check=True)` raises `JobFailed`
for a job that failed, with the server's account of why (kind, node, message, hint, log tail).

`pip install /path/to/checkout` installs this module (and `app/harvest_cli.py`, the `harvest`
command) without the server's requirements; see pyproject.toml.
"""

# No `from __future__ import annotations` here: Python 3.11's TypedDict sees Required and
# NotRequired only in evaluated annotations.
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterator, NotRequired, Optional, Required, TypedDict, Union, Unpack

__all__ = ["ApiError", "Client", "Event", "FINISHED", "Failure", "Job", "JobFailed", "JobFields", "Logs",
           "Workers"]

#: the states a job never leaves
FINISHED: tuple[str, ...] = ("done", "failed", "cancelled")


class JobFields(TypedDict, total=False):
    """What `POST /api/jobs` takes (the server's JobSpec checks it; see the README for the rules)."""

    name: Required[str]
    min_nodes: Required[int]
    max_nodes: Required[int]
    total_samples: Required[float]
    #: "nodes:samples/s, ..." or {"nodes": [...], "samples_per_second": [...]}; optional on real workers
    curve: Union[str, dict[str, list[float]], None]
    scale_up_seconds: float
    scale_down_seconds: float
    priority: float
    #: the argv each node runs (never through a shell), live mode
    command: Union[list[str], str]
    #: samples per step of `command` (the elastic runtime's jobs)
    global_batch: int
    #: "runtime" (the script uses core/runtime/elastic.py, the default) or "torchrun" (an unmodified script)
    launcher: str
    #: torchrun jobs: the RE2 pattern that finds progress in rank 0's output (group 1: samples)
    progress_pattern: str
    #: torchrun jobs: SIGTERM to SIGKILL at a restart, for the script to checkpoint
    stop_grace_seconds: float
    #: torchrun jobs: > 0 when the progress pattern counts steps of this many samples
    samples_per_step: float


class Workers(TypedDict, total=False):
    """The workers of a live job, as `GET /api/jobs/<id>` reports them; once the job has ended,
    what it kept of them (losses, generations, last metrics)."""

    generation: int
    world_size: int
    nodes: int
    members: list[str]
    regrouping: bool
    committed_step: int
    loss: Optional[float]          # rank 0's last loss (NaN once a run diverges)
    losses: list[list[float]]      # [step, loss] as rank 0 reported them
    metrics: dict[str, float]
    lost: list[str]
    last_rescale: Optional[dict[str, Any]]
    generations: list[dict[str, Any]]   # the last 10: members, when each synced, stepped and ended
    last_output: Optional[str]     # torchrun jobs: rank 0's last line of output


class Failure(TypedDict):
    """Why a job failed, as `GET /api/jobs/<id>` gives it for a failed job (`Job["failure"]`)."""

    kind: str                      # e.g. "command_not_found", "exception", "out_of_memory", "rendezvous"
    node: Optional[str]            # where it happened, None when no one node is to blame
    message: str
    hint: str                      # what to do about it ("" when there is no advice)
    tail: list[str]                # the last lines of that worker's log
    address: str                   # rendezvous: the host:port that could not be reached ("" otherwise)


class Event(TypedDict):
    """One of a job's events, as `GET /api/jobs/<id>/events` gives them: `seq` increases, so a
    script asks for those after the last it has seen."""

    seq: int
    time: float                    # epoch seconds (a replay: its own clock)
    kind: str                      # "job_submit", "probe", "job_rescaled", "job_trouble", "job_done", ...
    node: Optional[str]
    detail: Optional[str]


class Logs(TypedDict):
    """`GET /api/jobs/<id>/logs`: the last lines of each worker's log, rank 0's worker first."""

    job: str
    state: str
    workers: dict[str, list[str]]


class Job(TypedDict):
    """A job as the API returns it. `job()` adds the keys marked NotRequired; `jobs()` and
    `submit()` return the others."""

    id: str
    name: str
    owner: str
    state: str
    nodes: int
    slots: Optional[int]           # ranks per node of its nodes, None when they differ
    ranks: int                     # ranks over all its nodes
    min_nodes: int
    max_nodes: int
    priority: float
    samples_per_second: float
    samples_done: float
    total_samples: float
    progress: float
    eta: Optional[float]
    submit_time: Optional[float]
    start_time: Optional[float]
    end_time: Optional[float]
    confidence: Optional[str]
    curve: NotRequired[dict[str, list[float]]]
    scale_up_seconds: NotRequired[float]
    scale_down_seconds: NotRequired[float]
    launcher: NotRequired[str]
    progress_pattern: NotRequired[str]
    stop_grace_seconds: NotRequired[float]
    samples_per_step: NotRequired[float]
    workers: NotRequired[Workers]
    profile: NotRequired[Optional[dict[str, Any]]]
    why: NotRequired[str]
    run_as: NotRequired[str]                 # the Unix account its command runs as, where the site maps logins
    failure: NotRequired[Optional[Failure]]  # a failed job: why (absent or None otherwise)
    resubmitted_from: NotRequired[str]       # the failed or cancelled job it continues (`resubmit`)
    requeues: NotRequired[int]               # times a failure of its nodes only sent it back to the queue


class ApiError(Exception):
    """The server said no (`status` is its HTTP status), or gave no usable answer (`status` 0).

    One type for every failure so that a script needs one `except`; `field_errors` holds the
    server's message per field of a refused job (422), empty otherwise."""

    def __init__(self, status: int, message: str, field_errors: Optional[dict[str, str]] = None,
                 retry_after: Optional[float] = None) -> None:
        self.status = status
        self.message = message
        self.field_errors: dict[str, str] = dict(field_errors or {})
        #: a 429's Retry-After: seconds until the server takes the request again (None otherwise)
        self.retry_after = retry_after
        detail = "; ".join(f"{k}: {v}" for k, v in self.field_errors.items())
        super().__init__(f"{status or 'no answer'}: {message}" + (f" ({detail})" if detail else ""))


class JobFailed(Exception):
    """A job that ended "failed", raised by `Client.wait(..., check=True)`: `job` is the job as
    the server last gave it, `failure` the server's account of why (`{}` when it gave none)."""

    def __init__(self, job: Job, failure: Optional[Failure] = None) -> None:
        self.job = job
        self.failure: Failure = failure if failure is not None else job.get("failure") or {}  # type: ignore[assignment]
        f: dict[str, Any] = dict(self.failure)
        text = f"job {job.get('id', '?')} failed"
        if f.get("kind"):
            text += f": {f['kind']}"
        if f.get("node"):
            text += f" on {f['node']}"
        if f.get("message"):
            text += f": {f['message']}"
        if f.get("hint"):
            text += f" ({f['hint']})"
        super().__init__(text)

    def __reduce__(self):          # pickled (multiprocessing, Optuna's workers) with what it holds
        return type(self), (self.job, self.failure)


class Client:
    """One harvester at `url` (e.g. "http://head01:8050"), as the holder of `token` (from
    `POST /api/token`; `Client.login` gets one). Reads need no token, writes do.

    A request the server refuses for now (429: too many registrations this minute, a throttled
    login) is sent again once its `Retry-After` has passed, as long as the wait fits in
    `patience` seconds (a study registering trials in a burst goes on at the server's pace); a
    longer wait (the day's cap) raises ApiError 429 with `retry_after` at once."""

    def __init__(self, url: str, token: Optional[str] = None, timeout: float = 30.0,
                 patience: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.patience = patience

    @classmethod
    def login(cls, url: str, user: str, password: str, timeout: float = 30.0) -> "Client":
        """A client holding a fresh bearer token for `user` (valid 7 days), so that a password
        is sent once and never kept."""
        client = cls(url, timeout=timeout)
        body = client._request("POST", "/api/token", {"username": user, "password": password})
        client.token = str(body["token"])
        return client

    def submit(self, **fields: Unpack[JobFields]) -> Job:
        """Register a job; its id, state ("queued" or "running") and the rest as the server has
        it. A refused job raises ApiError 422 with `field_errors`, and nothing is stored."""
        return self._request("POST", "/api/jobs", dict(fields))

    def job(self, job_id: str) -> Job:
        """One job with its curve, the "why" line and, while it runs on real workers, `workers`
        (world size, rank 0's last loss, ...)."""
        return self._request("GET", f"/api/jobs/{_quote(job_id)}")

    def jobs(self, state: Optional[str] = None, owner: Optional[str] = None) -> list[Job]:
        """Every job the server knows (page after page), optionally only those in `state`
        ("queued", "running", "done", "failed", "cancelled") or of `owner` ("" is the replayed
        job set's)."""
        query = {k: v for k, v in (("state", state), ("owner", owner)) if v is not None}
        return self._pages("/api/jobs" + (f"?{urllib.parse.urlencode(query)}" if query else ""), "jobs")

    def _pages(self, path: str, key: str) -> list:
        """Every page of a listing, following each answer's `next`."""
        out: list = []
        next_path: Optional[str] = path
        while next_path:
            page = self._request("GET", next_path)
            out += page[key]
            next_path = page.get("next")
        return out

    def cancel(self, job_id: str) -> Job:
        """Cancel a job (its workers are stopped); ApiError 403 when it is someone else's and
        you are not staff, 404 when there is no such job, 409 when it has already ended."""
        return self._request("DELETE", f"/api/jobs/{_quote(job_id)}")

    def resubmit(self, job_id: str) -> Job:
        """Continue a failed or cancelled job as a new one (a new id; `resubmitted_from` names the
        old one) from its last checkpoint and sample count: samples it did are not done again.
        Checked as a new registration is (ApiError 422 with `field_errors`, e.g. too many jobs);
        ApiError 403 someone else's job and you are not staff, 404 no such job, 409 the job has
        not failed nor been cancelled (or its checkpoint cannot be copied)."""
        return self._request("POST", f"/api/jobs/{_quote(job_id)}/resubmit")

    def watch(self, job_id: str, poll_s: float = 1.0) -> Iterator[Job]:
        """The job every `poll_s` seconds, ending with the first answer in a final state: for a
        script that acts while a job trains (reads its loss, cancels it) and then goes on."""
        while True:
            job = self.job(job_id)
            yield job
            if job["state"] in FINISHED:
                return
            time.sleep(poll_s)

    def events(self, job_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        """The job's events with a `seq` above `after`, oldest first (page after page of `limit`,
        1 to 1000): `events(id, after=last_seq)` asks only for what is new. ApiError 404 no job."""
        query = urllib.parse.urlencode({"after": after, "limit": limit})
        return self._pages(f"/api/jobs/{_quote(job_id)}/events?{query}", "events")

    def wait(self, job_id: str, states: tuple[str, ...] = FINISHED, timeout: Optional[float] = None,
             poll_s: float = 1.0, check: bool = False, progress: Optional[Callable[[Job], None]] = None) -> Job:
        """The job once it is in one of `states`; TimeoutError after `timeout` seconds (None:
        no limit), since waiting too long is the caller's limit, not the server's refusal.
        It also returns when the job ends in a state outside `states`: nothing would change.
        With `check`, a job that ended "failed" raises JobFailed (why it failed, its log's
        last lines) instead of being returned. `progress`, when given, is called with the job at
        every look that does not return (to show how far it is)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if check and job["state"] == "failed":
                raise JobFailed(job)
            if job["state"] in states or job["state"] in FINISHED:
                return job
            if progress is not None:
                progress(job)
            if deadline is not None and time.monotonic() + poll_s > deadline:
                raise TimeoutError(f"job {job_id} is still {job['state']} after {timeout:g} s")
            time.sleep(poll_s)

    def logs(self, job_id: str, lines: int = 40) -> Logs:
        """The last `lines` (1 to 500) lines of each of the job's worker logs, rank 0's worker
        first: `{"job", "state", "workers": {worker: [line, ...]}}`. Only the job's owner and
        staff may read them (ApiError 401 without a token, 403 someone else's job, 404 no job)."""
        query = urllib.parse.urlencode({"lines": lines})
        return self._request("GET", f"/api/jobs/{_quote(job_id)}/logs?{query}")

    def reclaim(self, node: str) -> dict[str, Any]:
        """Staff: take `node` back as its owner would (live mode with a static node list); its
        job loses it. ApiError 403 when you are not staff, 404 no such node, 409 a server whose
        nodes are not operated by hand."""
        return self._node(node, "reclaim")

    def release(self, node: str) -> dict[str, Any]:
        """Staff: give a reclaimed `node` again, to be harvested (errors as `reclaim`)."""
        return self._node(node, "release")

    def clear(self, node: str) -> dict[str, Any]:
        """Staff, Slurm source: give a node skipped after failed pilots one again at once;
        `{"node", "command", "cleared": whether it was skipped}`. ApiError 409 on a server whose
        node source skips no node."""
        return self._node(node, "clear")

    def _node(self, node: str, command: str) -> dict[str, Any]:
        return self._request("POST", f"/api/nodes/{_quote(node)}/{command}")

    def _request(self, method: str, path: str, body: Optional[dict[str, Any]] = None) -> Any:
        """One request, sent again after a 429's Retry-After while that fits in `patience`."""
        deadline = time.monotonic() + self.patience
        while True:
            try:
                return self._send(method, path, body)
            except ApiError as e:
                if e.retry_after is None or time.monotonic() + e.retry_after > deadline:
                    raise
                time.sleep(e.retry_after)

    def _send(self, method: str, path: str, body: Optional[dict[str, Any]]) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                status, text, retry_after = resp.status, resp.read().decode("utf-8", "replace"), None
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode("utf-8", "replace")
            retry_after = _seconds(e.headers.get("Retry-After")) if status == 429 else None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ApiError(0, f"cannot reach {self.url}: {reason}") from e
        try:
            payload = json.loads(text) if text else None
        except ValueError:
            payload = None
        if status >= 400:
            if isinstance(payload, dict):
                errors = payload.get("errors")
                raise ApiError(status, str(payload.get("error") or text),
                               errors if isinstance(errors, dict) else None, retry_after)
            raise ApiError(status, text.strip()[:500] or f"HTTP {status}", retry_after=retry_after)
        if payload is None and text:
            raise ApiError(status, f"the server's answer is not JSON: {text[:200]!r}")
        return payload


def _seconds(value: Optional[str]) -> Optional[float]:
    """Retry-After in seconds (the harvester sends seconds, never an HTTP date)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _quote(job_id: str) -> str:
    return urllib.parse.quote(job_id, safe="")
