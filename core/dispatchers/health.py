"""How a runtime job's workers are doing, read from its coordinator's status on every poll:
policy only (no process, no thread, no transport), so that `WorkerDispatcher` just acts on it.

It names in the job's events each regroup with how long it took and a generation that failed
before its first step (with why), knows whether the job ever made a step (before that, a set-up
error fails it at once), and says when a job holding nodes has made no step for too long.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import failures
from ..failures import Failure
from ..model import Event, EventKind
from ..runtime import ranks


ABUSE_EVERY_S = 60.0      # the store's removals are said at most this often


@dataclass
class Health:
    troubled_gen: int = 0                     # last generation whose failure was named
    rescaled_gen: int = 0                     # last generation whose regroup was named
    stepped: bool = False                     # a generation of the job has made a step
    step_seen: tuple[int, float] = (-1, 0.0)  # (committed step, monotonic time it was first seen)
    stalled: bool = False                     # said once: no step for the start timeout
    fatal: Optional[Failure] = None           # a failure no retry can mend: the job fails with it
    abuse: tuple[int, int] = (0, 0)           # (keys removed, connections shut) already said
    abuse_said_at: float = float("-inf")      # monotonic: when that was last said

    def observe(self, job_id: str, st: dict, holding: bool, now: float, t: float,
                start_timeout_s: float) -> tuple[list[Event], Optional[tuple[int, list[str]]]]:
        """Events to log from this status (and `fatal` set when one fails the job), and
        (generation, its errors) the first time the job
        has held nodes without a new step for `start_timeout_s` (`holding`: it has nodes and is
        not waiting for adopted workers; `t`: monotonic now)."""
        out: list[Event] = []
        last = st.get("last_rescale") or {}
        gen = int(last.get("gen") or 0)
        if last.get("first_step_at") is not None:
            self.stepped = True
            if gen > self.rescaled_gen:
                self.rescaled_gen = gen
                out += _rescaled(job_id, last, now)
        errors = [s.get("error") for s in (last.get("stopped") or {}).values() if s.get("error")]
        if last.get("failed") and last.get("first_step_at") is None and errors and gen > self.troubled_gen:
            self.troubled_gen = gen
            trouble = failures.from_error_text(" | ".join(errors))
            out.append(Event(now, EventKind.JOB_TROUBLE, job=job_id, failure=trouble.to_dict(),
                             detail=f"generation {gen} failed before its first step: {trouble.line()}"))
            if failures.loopback_rendezvous(trouble) and not self.stepped:
                trouble.message = f"before the job's first step: {trouble.message}"
                self.fatal = trouble          # every retry would advertise the same loopback address
        out += self._abuse(job_id, st.get("store_host") or {}, now, t)
        if not holding or st["committed_step"] != self.step_seen[0]:
            self.step_seen = (st["committed_step"], t)
        elif t - self.step_seen[1] > start_timeout_s and not self.stalled:
            self.stalled = True
            return out, (gen, errors)
        return out, None

    def _abuse(self, job_id: str, host: dict, now: float, t: float) -> list[Event]:
        """What the job's store process removed or shut since it was last said, at most once a
        minute: someone who reaches the store's port is writing to it or flooding it."""
        keys, shut = int(host.get("foreign_keys") or 0), int(host.get("shut_connections") or 0)
        if (keys, shut) == self.abuse or t - self.abuse_said_at < ABUSE_EVERY_S:
            return []
        new_keys, new_shut = keys - self.abuse[0], shut - self.abuse[1]
        self.abuse, self.abuse_said_at = (keys, shut), t
        peers = sorted((host.get("peers_over_cap") or {}).items(), key=lambda kv: -kv[1])[:3]
        parts = ([f"removed {new_keys} key(s) that were not the job's"] if new_keys else []) + \
                ([f"shut {new_shut} connection(s) over the per-address cap"
                  + (" (" + ", ".join(f"{p}: {n}" for p, n in peers) + " in all)" if peers else "")]
                 if new_shut else [])
        return [Event(now, EventKind.JOB_TROUBLE, job=job_id, detail=(
            "its store " + " and ".join(parts) + ": something that reaches the store's port is "
            "writing to it or flooding it; the job trains on"))]

    def fails_at_once(self, failure: Failure) -> bool:
        """A set-up error (the command, the folder, the script's own exception) before the
        job's first step: every node would fail alike, so the job fails once, not per node.
        After it, the script's exception is one during training, at the committed step last seen
        (its hint says so, failures.raised_during)."""
        if failure.kind in failures.SETUP and not self.stepped:
            failure.message = f"before the job's first step: {failure.message}"
            return True
        if self.stepped:
            failures.raised_during(failure, f"at step {max(self.step_seen[0], 0)}")
        return False


def _rescaled(job_id: str, last: dict, now: float) -> list[Event]:
    size, before, pause = len(ranks.nodes_of(last["members"])), last.get("prev_nodes") or 0, last.get("switch_s")
    if before <= 0 or size == before or pause is None:
        return []
    return [Event(now, EventKind.JOB_RESCALED, job=job_id, detail=(
        f"{'grow' if size > before else 'shrink'} {before} → {size} nodes in {pause:.2f} s"
        + (" (after a lost node)" if last.get("reason") in ("failure", "node_lost") else "")))]


def stalled_failure(start_timeout_s: float, gen: int, errors: list[str], node: Optional[str],
                    tail: list[str]) -> Failure:
    """No step for `start_timeout_s`: named by the last generation's error, else by the last
    line of a node's log."""
    what = (f"no step for {start_timeout_s:g} s" + (f" (generation {gen}: {errors[0]})" if errors else "")
            + (f"; last line of {node}'s log: {tail[-1]}" if node and tail else ""))
    failure = Failure(failures.NO_PROGRESS, what, node, failures.hint_of(failures.NO_PROGRESS), tail)
    named = failures.from_error_text(errors[0]) if errors else None
    if named is not None and named.kind != failures.OTHER:
        failure.hint = named.hint
    return failure


def story_of(status: dict, generations: list[dict]) -> dict:
    """What a job's page keeps of its workers once they are gone: losses, last metrics and the
    generations with how long each regroup took."""
    keep = ("committed_step", "samples_done", "lost_samples", "loss", "losses", "metrics", "last_rescale")
    return {**{k: status.get(k) for k in keep}, "generations": generations}
