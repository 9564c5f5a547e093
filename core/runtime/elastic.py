"""Worker runtime for elastic data-parallel training: what a training script imports.

One long-lived worker process runs per GPU (slot) of each node (one on a CPU node). It connects to the job's coordinator, builds
the model while the job trains elsewhere, then trains in *generations*: each generation is a
process group over the nodes the controller gave the job. Growing or shrinking the job stops the
current generation at a step boundary and starts the next one with the same processes (about
0.1 s instead of a restart); the model, the optimizer state and the step carry over in memory.

    from core.runtime import elastic

    job = elastic.init(global_batch=64, total_samples=64_000, checkpoint_dir="ckpt")
    model, opt = build(job.device)                # warm-up while the job trains elsewhere
    job.attach(model, opt, dataset_size=len(x))   # ready; blocks until assigned (or told to exit)
    for step in job.steps():                      # the committed global step; regroups between steps
        idx = job.shard(step)                     # this rank's part of the step's global batch
        opt.zero_grad()
        loss_sum = F.cross_entropy(job.model(x[idx]), y[idx], reduction="sum")
        (loss_sum * job.loss_weight(step)).backward()   # = the global batch's mean loss after DDP
        opt.step()
        job.done_step(loss=loss_sum.item() / len(idx))
    # here only when every step is done: evaluate, save, print (job.rank == 0 is a good gate)

Rules of the API
- `job.device` is this rank's device: `cuda:LOCAL_RANK` when CUDA is available (made the current
  device), else the CPU; put the model there. `job.rank`, `job.world_size`, `job.local_rank`,
  `job.local_world_size`, `job.node_rank` and `job.nodes` (and torchrun's RANK, WORLD_SIZE,
  LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK/GROUP_RANK in os.environ) follow each generation; the
  ranks of a node are consecutive. The same script runs with 1 or N ranks per node.
- `job.model` is the model to call in the loop: DistributedDataParallel over the current group
  (gloo on CPU, nccl when the model is on CUDA), the plain model when running standalone.
- `job.shard(step)` gives the same global batch whatever the world size: a deterministic, per-epoch
  shuffled walk over `dataset_size` samples. `job.loss_weight(step)` = world_size / global batch
  of the step: multiply a *summed* loss by it and DDP's averaging yields exactly the global-batch
  mean (`loss.mean()` is fine too when the batch splits evenly).
- A peer dying mid-step (or any failed collective) never raises into the loop: the gradients of
  that step are dropped, `opt.step()` becomes a no-op for it, parameters stay at the last committed
  step, and the survivors continue in the next generation the coordinator assigns.
- Keep per-step state in the model and the optimizer (the only state synchronised to joining
  ranks); derive learning-rate schedules from `step`. Do not run your own collectives in the loop.
- `steps()` returns only when the job has finished. When the worker is dismissed, gets SIGTERM,
  or loses its coordinator, it leaves at the next step boundary and raises SystemExit (0; 3 when
  the coordinator vanished). With HARVEST_ORPHAN_S (pilots on Slurm) a lost coordinator is first
  redialed that long while the generation trains on: a restarted harvester adopts the worker.
- With `checkpoint_dir`, rank 0 writes `checkpoint.pt` atomically every `checkpoint_every_s`,
  when the last rank leaves, and at the end; a generation whose members hold no newer state
  restores it. This only protects against losing every node at once.
- Without the coordinator's environment (`HARVEST_STORE` unset) the same script runs alone:
  world size 1, no process group, same checkpoints.
Progress (step, samples, step time, loss) reaches the coordinator through the store, and, when
`HARVEST_REPORT_URL` is set, rank 0 POSTs it there as JSON with `Authorization: Bearer <token>`.

Inside: this module is the API and the generation loop; checkpoint files are `checkpoint`'s, the
store connections and helper threads `background`'s, state sync and the DDP wrapper `group`'s,
the sample order `sampling`'s.
"""
from __future__ import annotations

import atexit
import gc
import hashlib
import logging
import os
import queue
import signal
import socket
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import torch
import torch.distributed as dist

from . import group, netif
from . import protocol as P
from . import ranks
from .background import CoordinatorLink, Progress
from .checkpoint import Checkpoints
from .sampling import EpochOrder

__all__ = ["init", "ElasticJob", "pick_device"]

log = logging.getLogger("harvest.elastic")

EXIT_ORPHANED = 3


def pick_device(local_rank: int) -> torch.device:
    """`cuda:local_rank` (made current) when CUDA is available, else the CPU. A node showing
    fewer GPUs than its slots is a misconfiguration: RuntimeError, which loses the node with the
    reason in its log instead of two ranks sharing one GPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise RuntimeError(f"LOCAL_RANK {local_rank} but this process sees {count} GPU(s): the node's "
                           f"slots exceed its GPUs, or CUDA_VISIBLE_DEVICES hides some")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init(global_batch: Optional[int] = None, total_samples: Optional[int] = None, *,
         checkpoint_dir: Optional[str | os.PathLike] = None, checkpoint_every_s: float = 300.0,
         seed: int = 0, handle_sigterm: bool = True) -> "ElasticJob":
    """Connect to the job's coordinator (from the environment `JobCoordinator.worker_env()`
    gives) or, without it, prepare a standalone run. `checkpoint_dir` defaults to
    $HARVEST_CHECKPOINT_DIR (the controller's choice), else no checkpoints. Call from the main thread, early: it installs
    the SIGTERM handler. Under a coordinator its global batch and total samples win over the
    arguments (which are then only the standalone values). `seed` orders the samples
    (`shard`). With `handle_sigterm=False` the script handles SIGTERM itself."""
    return ElasticJob(global_batch, total_samples, checkpoint_dir=checkpoint_dir,
                      checkpoint_every_s=checkpoint_every_s, seed=seed,
                      handle_sigterm=handle_sigterm)


# ~330 lines: the user API and the generation loop (join, vote, step, stop, leave) share its state
class ElasticJob:
    """Handle of one worker's part in an elastic job (see the module docstring)."""

    def __init__(self, global_batch: Optional[int], total_samples: Optional[int], *,
                 checkpoint_dir: Optional[str | os.PathLike], checkpoint_every_s: float,
                 seed: int, handle_sigterm: bool = True) -> None:
        env = os.environ
        self.standalone = P.ENV_STORE not in env
        self.global_batch, self.total_samples = self._sizes(global_batch, total_samples)
        self.total_steps = P.total_steps(self.total_samples, self.global_batch)
        self.seed = int(seed)
        self._order = EpochOrder(self.seed)
        checkpoint_dir = checkpoint_dir or env.get(P.ENV_CHECKPOINT_DIR) or None
        self._ckpt = Checkpoints(Path(checkpoint_dir) if checkpoint_dir else None,
                                 checkpoint_every_s)
        self.job_id = env.get(P.ENV_JOB, "standalone")
        self.node = env.get(P.ENV_NODE, socket.gethostname())
        self.incarnation = int(env.get(P.ENV_INCARNATION, "0"))
        self.step = 0                      # committed steps held by this process
        self.rank, self.world_size, self.generation = 0, 1, 0
        self.local_rank = ranks.slot_of(self.node) if not self.standalone else \
            int(env.get(ranks.ENV_LOCAL_RANK, "0"))
        self.local_world_size, self.node_rank, self.nodes = 1, 0, 1
        self.device = pick_device(self.local_rank)
        self.finished = False
        self._raw_model: Optional[torch.nn.Module] = None
        self._opt: Optional[torch.optim.Optimizer] = None
        self._ddp: Optional[group.ElasticDDP] = None
        self._dataset_size: Optional[int] = None
        self._device = torch.device("cpu")
        self._backend = "gloo"
        self._poisoned = False
        self._in_generation = False
        self._sigterm = False
        self._was_rank0 = False
        self._fresh = True                 # never synced with a group: replicas may differ
        self._exit_reported = False
        self._progress = Progress()
        self._pending_run: Optional[dict] = None
        self._members: list[str] = []
        self._link: Optional[CoordinatorLink] = None
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        if not self.standalone:
            self._connect(env)

    def _sizes(self, global_batch: Optional[int], total_samples: Optional[int]) -> tuple[int, int]:
        """The job's global batch and total samples: the coordinator's, else the script's."""
        if not self.standalone:
            env = os.environ
            cb, ct = int(env[P.ENV_GLOBAL_BATCH]), int(env[P.ENV_TOTAL_SAMPLES])
            if (global_batch, total_samples) not in ((None, None), (cb, ct)):
                log.info("coordinator's global batch %d / total samples %d replace the script's "
                         "%s / %s", cb, ct, global_batch, total_samples)
            global_batch, total_samples = cb, ct
        if not global_batch or not total_samples or global_batch <= 0 or total_samples <= 0:
            raise ValueError("global_batch and total_samples must be positive")
        return int(global_batch), int(total_samples)

    def _connect(self, env: Mapping[str, str]) -> None:
        host, _, port = env[P.ENV_STORE].rpartition(":")
        if port.isdigit():
            netif.bind_towards(host.strip("[]"), int(port))     # no GLOO_SOCKET_IFNAME to guess
        self._pg_timeout = float(env.get(P.ENV_PG_TIMEOUT, "10"))
        self._checksums = env.get(P.ENV_CHECKSUMS, "1") == "1"
        self._link = CoordinatorLink.from_env(
            env, self.node, self.incarnation, self._pg_timeout, progress=self._publishing,
            snapshot=lambda: self._progress.snapshot(self), whereabouts=self._whereabouts)
        atexit.register(self._atexit)
        self._event(P.EV_HELLO, host=socket.gethostname())
        self._link.start()

    # ------------------------------------------------------------------ public API
    @property
    def model(self) -> torch.nn.Module:
        """The model to call in the loop (DDP-wrapped while in a group)."""
        if self._raw_model is None:
            raise RuntimeError("attach(model, optimizer) first")
        return self._ddp if self._ddp is not None else self._raw_model

    @property
    def checkpoint_dir(self) -> Optional[Path]:
        return self._ckpt.directory

    @checkpoint_dir.setter
    def checkpoint_dir(self, value: Optional[Path]) -> None:
        self._ckpt.directory = value

    @property
    def checkpoint_every_s(self) -> float:
        return self._ckpt.every_s

    @checkpoint_every_s.setter
    def checkpoint_every_s(self, value: float) -> None:
        self._ckpt.every_s = float(value)

    def attach(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
               dataset_size: Optional[int] = None) -> None:
        """Register the model and its optimizer, restore a checkpoint if one exists, warm up,
        tell the coordinator this worker is ready, and wait for the first assignment (SystemExit
        if told to exit instead)."""
        self._raw_model, self._opt = model, optimizer
        self._dataset_size = int(dataset_size) if dataset_size else None
        params = list(model.parameters())
        self._device = params[0].device if params else torch.device("cpu")
        self._backend = ("nccl" if self._device.type == "cuda" and dist.is_nccl_available()
                         else "gloo")
        optimizer.register_step_pre_hook(self._skip_lost_step)
        if self._ckpt.disk_step() > self.step:
            self._load_checkpoint()
        if self.standalone:
            return
        import torch._dynamo  # noqa: F401  DDP() imports it lazily: 1-1.5 s on the first regroup
        self._event(P.EV_READY, step=self.step)
        self._pending_run = self._next_command()

    def steps(self) -> Iterator[int]:
        """Yield the global step to run, generation after generation, until the job is done."""
        if self._raw_model is None:
            raise RuntimeError("attach(model, optimizer) before steps()")
        if self.standalone:
            yield from self._standalone_steps()
            return
        while True:
            cmd = self._pending_run or self._next_command()
            self._pending_run = None
            reason = yield from self._generation(cmd)
            if reason == P.STOP_FINISHED:
                self.finished = True
                return
            if reason == P.STOP_LEAVING:
                self._leave_now(self._leave_reason(), EXIT_ORPHANED if self._orphaned else 0)

    def shard(self, step: int) -> torch.Tensor:
        """Indices (int64, CPU) of this rank's samples in the global batch of `step`: positions
        step*global_batch... of a walk over the data set, reshuffled every epoch (seeded), or the
        raw positions when attach() got no dataset_size."""
        return self._order.shard(step, self.rank, self.world_size, self.global_batch,
                                 self.total_samples, self._dataset_size)

    def loss_weight(self, step: int) -> float:
        """world_size / samples in the step's global batch (multiply a summed loss by it)."""
        return self.world_size / max(1, P.batch_of_step(step, self.total_samples, self.global_batch))

    def done_step(self, samples: Optional[int] = None, loss: Optional[float] = None,
                  **metrics: float) -> None:
        """Record the metrics of the step just run; rank 0 reports them. Optional: the step is
        committed when the loop comes back to `steps()`, and sample accounting is exact from
        the step count (`samples`, this rank's share, is informational)."""
        self._progress.record(samples, loss, metrics)

    def param_checksum(self) -> str:
        """Hash of the parameters' bytes: equal on every rank of a healthy group."""
        h = hashlib.blake2b(digest_size=12)
        assert self._raw_model is not None
        for p in self._raw_model.parameters():
            t = p.detach().reshape(-1).cpu().contiguous()
            h.update(t.view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    @property
    def samples_done(self) -> int:
        return P.samples_after(self.step, self.total_samples, self.global_batch)

    # ------------------------------------------------------------------ generations
    def _generation(self, cmd: dict) -> Iterator[int]:
        gen, rank, world = int(cmd["gen"]), int(cmd["rank"]), int(cmd["world"])
        self.generation, self.rank, self.world_size = gen, rank, world
        self._take_place(cmd.get("members") or [])
        self._in_generation, self._poisoned = True, False
        self._was_rank0 = rank == 0
        self._progress.commits.clear()
        reason, error, all_leaving = P.STOP_FAILED, "", False
        joined = False
        try:
            if dist.is_initialized():       # a group the previous generation failed to destroy
                dist.destroy_process_group()
            assert self._link is not None
            dist.init_process_group(self._backend,
                                    store=dist.PrefixStore(P.group_prefix(gen), self._link.pgstore),
                                    rank=rank, world_size=world,
                                    timeout=timedelta(seconds=self._pg_timeout))
            joined = True
            src, steps, restored = self._sync_state()
            self._event(P.EV_SYNCED, gen=gen, rank=rank, world=world, step=self.step, src=src,
                        steps=steps, restored=restored, place=self._place_seen(),
                        checksum=self.param_checksum() if self._checksums else None)
            assert self._raw_model is not None
            self._ddp = group.wrap(self._raw_model, self, self._device)
        except Exception as e:  # noqa: BLE001 - a peer gone during set-up: this generation failed
            error = f"{type(e).__name__}: {str(e)[:300]}"
        else:
            try:
                reason, error, all_leaving = yield from self._train(gen, rank, world)
            except GeneratorExit:      # the script left the loop (break, or an exception in it)
                self._finish_generation(gen, rank, joined, P.STOP_LEAVING,
                                        "the training loop was left", False)
                raise
        return self._finish_generation(gen, rank, joined, reason, error, all_leaving)

    def _train(self, gen: int, rank: int, world: int) -> Iterator[int]:
        assert self._link is not None
        first = True
        while True:
            if self.step >= self.total_steps:
                return P.STOP_FINISHED, "", False
            votes = torch.tensor([1.0 if gen in self._link.stop_gens else 0.0,
                                  1.0 if self._leaving() else 0.0], device=self._device)
            try:
                dist.all_reduce(votes)
            except Exception as e:  # noqa: BLE001
                return P.STOP_FAILED, f"{type(e).__name__}: {str(e)[:300]}", False
            leavers, stop = int(votes[1].item()), votes[0].item() > 0
            if leavers or stop:
                return (P.STOP_LEAVING if self._leaving() else P.STOP_ASKED), "", leavers >= world
            self._poisoned = False
            yield self.step
            if self._poisoned:
                return P.STOP_FAILED, "a collective failed during the step; it was not applied", False
            self.step += 1
            self._progress.commit()
            if first:
                first = False
                if rank == 0:
                    self._event(P.EV_FIRST_STEP, gen=gen, step=self.step)
            if rank == 0 and self._ckpt.due():
                self._save_checkpoint()

    def _finish_generation(self, gen: int, rank: int, joined: bool, reason: str, error: str,
                           all_leaving: bool) -> str:
        self._ddp = None
        if joined:
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
        self._in_generation = False
        if rank == 0 and (reason == P.STOP_FINISHED or all_leaving):
            self._save_checkpoint()
        self._event(P.EV_STOPPED, gen=gen, step=self.step, reason=reason, error=error,
                    checksum=self.param_checksum() if self._checksums else None)
        return reason

    def _sync_state(self) -> tuple[int, list[int], bool]:
        assert self._raw_model is not None and self._opt is not None
        self.step, src, steps, restored = group.sync_state(
            self._raw_model, self._opt, self.step, self._fresh, self._ckpt, self.rank,
            self.world_size, self._device, self._backend)
        self._fresh = False
        return src, steps, restored

    def _whereabouts(self) -> dict:
        """Where this worker stands, for a coordinator that restarted (the `rejoin` event)."""
        return {"gen": self.generation, "rank": self.rank, "world": self.world_size,
                "members": list(self._members), "step": self.step, "running": self._in_generation}

    def _take_place(self, members: list[str]) -> None:
        """This rank's place in the new generation, in the attributes and in os.environ (what
        torchrun would have set), for scripts and libraries that read them."""
        self._members = list(members)
        if self.node not in members:
            return
        where = ranks.place(members, self.node)
        self.local_world_size, self.node_rank, self.nodes = \
            where.local_world_size, where.node_rank, where.nodes
        os.environ.update(where.env())

    def _place_seen(self) -> dict:
        """This rank's place as the script sees it (os.environ), for the coordinator's record."""
        env = os.environ
        return {"rank": self.rank, "local_rank": self.local_rank, "node_rank": self.node_rank,
                "local_world_size": self.local_world_size, "nodes": self.nodes,
                "env": {k: env.get(k) for k in (ranks.ENV_RANK, ranks.ENV_WORLD_SIZE, ranks.ENV_LOCAL_RANK,
                                                ranks.ENV_NODE_RANK, ranks.ENV_LOCAL_WORLD_SIZE)},
                "device": str(self._device), "backend": self._backend}

    def _skip_lost_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if self._poisoned:          # drop this step's gradients: optimizers skip grad-less params
            for group_ in optimizer.param_groups:
                for p in group_["params"]:
                    p.grad = None

    @property
    def _orphaned(self) -> bool:
        """The coordinator (its store) vanished."""
        return self._link is not None and self._link.orphaned

    def _leaving(self) -> bool:
        link = self._link
        return self._sigterm or (link is not None and (link.leave_asked or link.orphaned))

    def _leave_reason(self) -> str:
        return ("orphaned" if self._orphaned else "sigterm" if self._sigterm else "dismissed")

    # ------------------------------------------------------------------ standalone
    def _standalone_steps(self) -> Iterator[int]:
        self._was_rank0 = True
        while self.step < self.total_steps:
            if self._sigterm:
                self._save_checkpoint()
                raise SystemExit(0)
            yield self.step
            self._poisoned = False
            self.step += 1
            self._progress.commit()
            if self._ckpt.due():
                self._save_checkpoint()
        self._save_checkpoint()
        self.finished = True

    # ------------------------------------------------------------------ waiting, leaving
    def _next_command(self) -> dict:
        assert self._link is not None
        while True:
            if self._leaving():
                self._leave_now(self._leave_reason(), EXIT_ORPHANED if self._orphaned else 0)
            try:
                cmd = self._link.commands.get(timeout=0.2)
            except queue.Empty:
                continue
            if cmd["op"] == P.OP_RUN:
                return cmd

    def _leave_now(self, reason: str, code: int = 0) -> None:
        if self._was_rank0:
            self._save_checkpoint()
        self._event(P.EV_EXIT, reason=reason, step=self.step)
        self._exit_reported = True
        raise SystemExit(code)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """Leave at the next step boundary (or at once while waiting: `_next_command` polls the
        flag). Before attach() there is nothing to hand over: exit right away."""
        self._sigterm = True
        if self._raw_model is None:
            if self.standalone:
                raise SystemExit(0)
            self._leave_now("sigterm", 0)

    def _atexit(self) -> None:
        if not self._exit_reported:
            self._exit_reported = True
            self._event(P.EV_EXIT, reason="finished" if self.finished else "process-exit",
                        step=self.step)
        if self._link is not None:
            self._link.stop()
        # The interpreter's last collections walk torch's huge module graph: 0.5-1 s here
        # (measured), which a preempted node would wait for. Nothing left needs collecting.
        gc.freeze()

    # ------------------------------------------------------------------ checkpoints
    def _load_checkpoint(self) -> None:
        assert self._raw_model is not None and self._opt is not None
        self.step = self._ckpt.load(self._raw_model, self._opt, self._device)

    def _save_checkpoint(self) -> None:
        self._ckpt.save(self.step, self._raw_model, self._opt,
                        {"job": self.job_id, "global_batch": self.global_batch,
                         "total_samples": self.total_samples})

    # ------------------------------------------------------------------ talking to the coordinator
    def _event(self, kind: str, **fields: Any) -> None:
        if self._link is not None:
            self._link.event(kind, **fields)

    def _publishing(self) -> Optional[int]:
        """The progress sequence number while this worker publishes progress (rank 0 in a
        running generation), else None (read by the link's threads)."""
        return self._progress.seq if self._in_generation and self.rank == 0 else None
