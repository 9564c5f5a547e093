"""What a generation does over its process group besides training: sync state, wrap in DDP.

Kept apart from `elastic` because it is torch.distributed plumbing the user never sees: the
broadcast of model, optimizer and step from the chosen rank (receivers apply nothing until every
transfer succeeded), and a DDP whose collectives never raise into the training loop. Nothing a
peer sends is unpickled: state travels as tensors plus a JSON skeleton of the optimizer state.
"""
from __future__ import annotations

import inspect
import json
from typing import Any, Optional, Protocol

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as _DDP

from .checkpoint import Checkpoints

__all__ = ["ElasticDDP", "StepGuard", "wrap", "sync_state", "broadcast_state"]

# torch >= 2.12 renamed DDP's broadcast_buffers (runtime buffer sync) to forward_sync_buffers
_DDP_BUFFERS_KW = ("forward_sync_buffers" if "forward_sync_buffers" in
                   inspect.signature(_DDP.__init__).parameters else "broadcast_buffers")


class StepGuard(Protocol):
    """What the DDP wrapper needs of the job: the world size and the lost-step flag it sets."""

    world_size: int
    _poisoned: bool


def _done_future(value: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(value)
    return fut


class ElasticDDP(_DDP):
    """DDP whose collectives never raise into the training loop: a failure marks the step lost."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        job = self.__dict__["_elastic_job"]
        if job._poisoned:
            return self.module(*args, **kwargs)
        try:
            return super().forward(*args, **kwargs)
        except RuntimeError:
            # DDP's own collectives (bucket rebuild) failed, or the module itself raised: either
            # way this step is lost; a genuine error in the module raises again just below.
            job._poisoned = True
            return self.module(*args, **kwargs)


def _allreduce_hook(job, bucket):  # no annotations: DDP checks them at runtime
    buf = bucket.buffer()
    if job._poisoned:
        return _done_future(buf)
    buf.div_(job.world_size)
    try:
        fut = dist.all_reduce(buf, async_op=True).get_future()
    except Exception:  # noqa: BLE001 - any failure loses the step, nothing else
        job._poisoned = True
        return _done_future(buf)

    def finish(f: torch.futures.Future) -> torch.Tensor:
        try:
            return f.value()[0]
        except Exception:  # noqa: BLE001
            job._poisoned = True
            return buf

    return fut.then(finish)


def wrap(model: torch.nn.Module, job: StepGuard, device: torch.device) -> ElasticDDP:
    """`model` in an ElasticDDP over the current group that reports failures to `job`."""
    # state is already identical (synced first); buffers are synced at each generation start
    kw: dict[str, Any] = {"init_sync": False, _DDP_BUFFERS_KW: False}
    if device.type == "cuda":
        kw["device_ids"] = [device]
    ddp = ElasticDDP(model, **kw)
    ddp.__dict__["_elastic_job"] = job
    ddp.register_comm_hook(job, _allreduce_hook)
    return ddp


def sync_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, fresh: bool,
               ckpt: Checkpoints, rank: int, world: int, device: torch.device,
               backend: str) -> tuple[int, int, list[int], bool]:
    """All ranks take the state of the most advanced rank, or of the checkpoint when it is
    newer than every member's state (every node was lost). Nothing but the buffers moves when
    every rank already holds the same synced state (a pure shrink); `fresh`: this rank never
    synced with a group. Returns (step, source rank, every rank's step, restored)."""
    mine = torch.tensor([step, int(fresh), ckpt.disk_step()], dtype=torch.int64, device=device)
    got = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(got, mine)
    rows = [[int(v) for v in t.tolist()] for t in got]
    steps = [r[0] for r in rows]
    best, disk = max(steps), max(r[2] for r in rows)
    restored = disk > best
    if restored:                   # the first rank that sees the newest checkpoint loads it
        src = next(i for i, r in enumerate(rows) if r[2] == disk)
        if rank == src:
            step = ckpt.load(model, optimizer, device)
    else:                          # most advanced; a rank with synced state among equals
        src = min((r[1], i) for i, r in enumerate(rows) if r[0] == best)[1]
    need = restored or any(r[0] != best or r[1] for r in rows)
    step = broadcast_state(model, optimizer, step, src, rank, device, backend, need)
    return step, src, steps, restored


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int,
                    src: int, rank: int, device: torch.device, backend: str, need: bool) -> int:
    """Every rank takes rank `src`'s parameters (when `need`), buffers, optimizer state (when
    `need`) and step; returns the step. A peer dying mid-sync raises and leaves this rank's
    state as it was: receivers land everything in temporaries and apply it at the end."""
    mine_src = rank == src
    tensors = [p.data for p in model.parameters()] if need else []
    tensors += [b.data for b in model.buffers()]
    with torch.no_grad():
        recv = tensors if mine_src else [torch.empty_like(t) for t in tensors]
        for t in recv:
            dist.broadcast(t, src)
        opt_state = _broadcast_optimizer(optimizer, src, rank, device, backend) if need else None
        step_t = torch.tensor([step], dtype=torch.int64, device=device)
        dist.broadcast(step_t, src)
        if not mine_src:
            for t, r in zip(tensors, recv):
                t.copy_(r)
            if opt_state is not None:
                optimizer.load_state_dict(opt_state)
    return int(step_t.item())


def _broadcast_optimizer(optimizer: torch.optim.Optimizer, src: int, rank: int,
                         device: torch.device, backend: str) -> Optional[dict]:
    """Optimizer state: a tensor-free skeleton as JSON, then each tensor. Returns the state dict
    to load on receivers (None on the source)."""
    tensors: list[torch.Tensor] = []
    payload: Optional[bytes] = None
    if rank == src:
        try:
            payload = _dumps(_strip(optimizer.state_dict(), tensors))
        except (TypeError, ValueError):
            payload = None           # the receivers must hear it too: see _broadcast_bytes
    data = _broadcast_bytes(payload, src, rank, device)
    if rank != src:
        tensors = []
        skeleton = _alloc(_loads(data), tensors)
    for t in tensors:
        if t.device != device and backend == "nccl":
            tmp = t.to(device)
            dist.broadcast(tmp, src)
            t.copy_(tmp)
        else:
            dist.broadcast(t, src)
    return _fill(skeleton, tensors) if rank != src else None


def _broadcast_bytes(payload: Optional[bytes], src: int, rank: int, device: torch.device) -> bytes:
    """`payload` of rank `src` on every rank: its length, then its bytes, as uint8 tensors. A
    source without a payload (None) sends length -1 and every rank raises ValueError."""
    n = torch.tensor([-1 if payload is None else len(payload)], dtype=torch.int64, device=device)
    dist.broadcast(n, src)
    size = int(n.item())
    if size < 0:
        raise ValueError("the optimizer state of the source rank cannot be sent as JSON")
    if rank == src and size:
        assert payload is not None
        buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(size, dtype=torch.uint8, device=device)
    if size:
        dist.broadcast(buf, src)
    return payload if rank == src and payload is not None else bytes(buf.cpu().numpy())


# -------------------------------------------------------------------- optimizer state transport
def _strip(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return {"__tensor__": len(tensors) - 1, "shape": list(obj.shape), "dtype": str(obj.dtype),
                "device": str(obj.device)}
    if isinstance(obj, dict):
        return {k: _strip(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_strip(v, tensors) for v in obj)
    return obj


def _is_slot(obj: Any) -> bool:
    return isinstance(obj, dict) and "__tensor__" in obj and "dtype" in obj and len(obj) == 4


def _alloc(skel: Any, tensors: list[torch.Tensor]) -> Any:
    if _is_slot(skel):
        dtype = getattr(torch, str(skel["dtype"]).removeprefix("torch."), None)
        shape = skel["shape"]
        if not isinstance(dtype, torch.dtype) or not isinstance(shape, list) or \
                not all(isinstance(d, int) and d >= 0 for d in shape) or \
                skel["__tensor__"] != len(tensors):
            raise ValueError(f"bad tensor slot in the optimizer skeleton: {skel!r:.200}")
        device = torch.device(skel["device"])
        if device.type == "cuda" and not torch.cuda.is_available():
            device = torch.device("cpu")
        tensors.append(torch.empty(shape, dtype=dtype, device=device))
        return skel
    if isinstance(skel, dict):
        return {k: _alloc(v, tensors) for k, v in skel.items()}
    if isinstance(skel, (list, tuple)):
        return type(skel)(_alloc(v, tensors) for v in skel)
    return skel


def _fill(skel: Any, tensors: list[torch.Tensor]) -> Any:
    if _is_slot(skel):
        return tensors[skel["__tensor__"]]
    if isinstance(skel, dict):
        return {k: _fill(v, tensors) for k, v in skel.items()}
    if isinstance(skel, (list, tuple)):
        return type(skel)(_fill(v, tensors) for v in skel)
    return skel


# -------------------------------------------------------------------- the skeleton as JSON
# JSON has no int keys and no tuples, which optimizer state dicts have ({"state": {0: ...}},
# "betas": (0.9, 0.999)): every dict is sent as {"d": [[key, value], ...]}, every tuple as
# {"t": [...]}; lists, strings, numbers, booleans and None as themselves.
def _to_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {"d": [[_to_json(k), _to_json(v)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"t": [_to_json(v) for v in obj]}
    if isinstance(obj, list):
        return [_to_json(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"{type(obj).__name__} in an optimizer state dict cannot be sent as JSON")


def _from_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"d"}:
            return {_from_json(k): _from_json(v) for k, v in obj["d"]}
        if set(obj) == {"t"}:
            return tuple(_from_json(v) for v in obj["t"])
        raise ValueError(f"unexpected object in the optimizer skeleton: {sorted(obj)[:5]}")
    if isinstance(obj, list):
        return [_from_json(v) for v in obj]
    return obj


def _dumps(skel: Any) -> bytes:
    return json.dumps(_to_json(skel), separators=(",", ":")).encode()


def _loads(data: bytes) -> Any:
    return _from_json(json.loads(data.decode()))
