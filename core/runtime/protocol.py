"""What a JobCoordinator (controller side) and its workers (`core.runtime.elastic`) say to each other.

Transport: one `torch.distributed.TCPStore` per job, owned (served) by the coordinator. Every key
below lives under the job's namespace and every value carries an HMAC tag, both from the per-job
secret (HARVEST_STORE_SECRET; core/runtime/signing.py). Every value is UTF-8 JSON.
Workers are named by *worker key* (core/runtime/ranks.py: the node, or `node:i` for slot i of a
node with several GPUs; `<node>` below); one key can name several worker processes over a job's
life (a restart after a crash), so each `worker_env()` call hands out a new *incarnation* number and
per-worker keys carry both. No key is ever waited on with an expiring timeout (TCPStore's
`wait(keys, timeout)` stalls for the store timeout after it expires): readers either poll with
`check()` (~10 us on the controller's own store) or block in `wait()` until the key appears.

Keys
  meta                        job parameters, written once by the coordinator (see `meta()`)
  cmd/<node>/<inc>/<k>        k-th command (k = 0, 1, ...) to one worker; written by the coordinator,
                              read in order by the worker's watcher thread (a blocking wait, so a
                              command reaches the worker in one round trip):
                                {"op": "run", "gen": G, "rank": r, "world": W, "members": [...]}
                                {"op": "stop", "gen": G}   stop generation G at the next step boundary
                                {"op": "exit"}             leave the group (if in one) and exit 0
  evn                         event counter (workers `add` 1, then write ev/<n>)
  ev/<n>                      n-th worker event, n = 1, 2, ... (the coordinator reads then deletes it)
  hb/<node>/<inc>             heartbeat counter, bumped every HEARTBEAT_S by a worker thread
  progress                    latest progress of the running generation, written ~5x/s by its rank 0
  gen<G>/...                  process group of generation G (PrefixStore: gloo/nccl rendezvous,
                              tagged like the rest)

Worker events (field "ev"; every event also has node, inc, pid, t = worker wall time)
  hello       connected to the store (torch imported)
  ready       model built, waiting for an assignment           {step}
  synced      group of generation G initialised, state synced  {gen, rank, step, src, steps, checksum,
                                                                 place: the rank's RANK, LOCAL_RANK, ...}
  first_step  rank 0 committed its first step in generation G  {gen, step}
  stopped     left generation G at a step boundary             {gen, step, reason, checksum, error}
              reason: "stop" (asked), "finished" (all steps done), "failed" (a collective failed:
              parameters are at the last committed step), "leaving" (this worker exits next)
  exit        the worker process is exiting                    {reason}
  rejoin      connected again after the store went away (the harvester restarted; HARVEST_ORPHAN_S)
                                                               {gen, rank, world, members, step,
                                                                running: still in generation gen,
                                                                k: index of its next command}

Stop agreement: at every step boundary each rank all_reduces (SUM) a two-element tensor
[stop asked for this generation, this rank is leaving]; any non-zero stops every rank before the
same step, so the group always stops on a step that every rank committed.
"""
from __future__ import annotations

import json
import math
from typing import Any, Optional

# environment of a worker process (what JobCoordinator.worker_env returns)
ENV_STORE = "HARVEST_STORE"                  # "host:port" of the job's TCPStore
ENV_JOB = "HARVEST_JOB"
ENV_NODE = "HARVEST_NODE"
ENV_INCARNATION = "HARVEST_INCARNATION"
ENV_TOKEN = "HARVEST_TOKEN"                  # per-job bearer token for progress reports
ENV_SECRET = "HARVEST_STORE_SECRET"          # per-job key of the store's namespace and HMAC tags
ENV_REPORT_URL = "HARVEST_REPORT_URL"         # optional: POST JSON progress reports here
ENV_REPORT_INTERVAL = "HARVEST_REPORT_INTERVAL"
ENV_GLOBAL_BATCH = "HARVEST_GLOBAL_BATCH"
ENV_TOTAL_SAMPLES = "HARVEST_TOTAL_SAMPLES"
ENV_PG_TIMEOUT = "HARVEST_PG_TIMEOUT"
ENV_CHECKSUMS = "HARVEST_CHECKSUMS"          # "1": hash parameters at every sync and stop
ENV_CHECKPOINT_DIR = "HARVEST_CHECKPOINT_DIR"  # default checkpoint dir (the script's argument wins)
ENV_ORPHAN = "HARVEST_ORPHAN_S"              # seconds a worker trains on without its store, redialing
                                             # it (0: it leaves at once, as an orphan)

META = "meta"
EVENT_COUNTER = "evn"
PROGRESS = "progress"

HEARTBEAT_S = 1.0           # worker heartbeat period
PROGRESS_S = 0.2            # rank 0 progress key period

EV_HELLO = "hello"
EV_READY = "ready"
EV_SYNCED = "synced"
EV_FIRST_STEP = "first_step"
EV_STOPPED = "stopped"
EV_EXIT = "exit"
EV_REJOIN = "rejoin"

OP_RUN = "run"
OP_STOP = "stop"
OP_EXIT = "exit"

STOP_ASKED = "stop"
STOP_FINISHED = "finished"
STOP_FAILED = "failed"
STOP_LEAVING = "leaving"


def cmd_key(node: str, incarnation: int, k: int) -> str:
    return f"cmd/{node}/{incarnation}/{k}"


def event_key(n: int) -> str:
    return f"ev/{n}"


def heartbeat_key(node: str, incarnation: int) -> str:
    return f"hb/{node}/{incarnation}"


def group_prefix(gen: int) -> str:
    return f"gen{gen}"


def total_steps(total_samples: int, global_batch: int) -> int:
    """Steps to process `total_samples`; the last step is partial when they do not divide."""
    return -(-int(total_samples) // int(global_batch))


def batch_of_step(step: int, total_samples: int, global_batch: int) -> int:
    """Samples in the global batch of `step` (global_batch except maybe the last step)."""
    return max(0, min(global_batch, total_samples - step * global_batch))


def samples_after(steps: int, total_samples: int, global_batch: int) -> int:
    """Samples processed once `steps` steps are committed (exact)."""
    return min(int(total_samples), int(steps) * int(global_batch))


def encode(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def decode(raw: bytes | str) -> Any:
    return json.loads(raw.decode() if isinstance(raw, (bytes, bytearray)) else raw)


def clean_progress(prog: Any) -> dict:
    """Rank 0's progress record (JSON the job wrote, where NaN is a word) with numbers the
    harvester can show and use: none ({}) when it is no object or its step no whole number >= 0;
    a rate, step time or loss that is not finite (a diverged loss) is None, a metric that is not a
    finite number is left out."""
    step = prog.get("step", 0) if isinstance(prog, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return {}
    metrics = prog.get("metrics")
    return {**prog, "samples_per_second": _finite(prog.get("samples_per_second"), 0.0),
            "step_time_s": _finite(prog.get("step_time_s"), 0.0), "loss": _finite(prog.get("loss")),
            "metrics": {k: v for k, v in metrics.items() if _finite(v) is not None} if isinstance(metrics, dict) else {}}


def _finite(value: Any, least: float = -math.inf) -> Optional[float]:
    """The number if it is a finite one of at least `least`, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) and value >= least else None
