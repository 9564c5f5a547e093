"""PBS Professional / OpenPBS as a pilot scheduler (core/pilots/base.py). A pilot is a one-chunk
job pinned to its vnode (`-l select=1:vnode=NAME:ncpus=ALL[:ngpus=ALL]`) in a low-priority queue
that a site's main queues preempt (`preempt_queue_prio`, `preempt_order`). PBS preempts by
requeue (`R`, SIGTERM then SIGKILL after the queue's `kill_delay`): the pilot tells the hub at
SIGTERM and leaves, and the harvester deletes the requeued pilot at once (`requeues_preempted`)
so that it never comes back onto the node the main job took. A pilot suspended instead (`S`)
holds its node's memory while the main job runs: the harvester treats it as gone at the next
poll (the node leaves its job) and deletes it. The pilot is the Python program itself
(`qsub -- python -c ...`), so nothing depends on how PBS runs job scripts; it learns its vnode
from HARVEST_PILOT_NODE (PBS's own variables name the host, not the vnode)."""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from ..pilots.base import BatchJob, BatchNode, Scheduler
from ..pilots.settings import PilotSettings, SettingError
from ..pilots.wire import ENV_NODE
from .cli import PbsCli
from .records import PbsNode


def qsub_options(s: PilotSettings, node: str, known: Optional[PbsNode]) -> list[str]:
    """One chunk on the vnode with all its cpus and GPUs, rerunnable (PBS preempts only jobs
    it can requeue, under preempt_order R), no mail, output joined."""
    chunk = f"select=1:vnode={node}:ncpus={known.ncpus if known is not None and known.ncpus else 1}"
    if known is not None and known.ngpus:
        chunk += f":ngpus={known.ngpus}"
    hours, minutes = divmod(s.time_limit_min, 60)
    opts = ["-q", s.partition, "-N", s.pilot_name, "-l", chunk, "-l", f"walltime={hours:02d}:{minutes:02d}:00",
            "-r", "y", "-j", "oe", "-m", "n", "-o", f"{s.log_dir}/" if s.log_dir else "/dev/null"]
    if s.account:
        opts += ["-A", s.account]
    return opts


def pilot_argv(s: PilotSettings, script: str) -> list[str]:
    """The pilot's batch script as the program PBS runs: its Python with the script's body."""
    body = script.split("\n", 1)[1] if script.startswith("#!") else script
    return [s.python, "-c", body]


class PbsScheduler(Scheduler):
    name = "pbs"
    title = "PBS"
    queue_word = "queue"
    requeues_preempted = True

    def __init__(self, settings: PilotSettings, cli: Optional[PbsCli] = None) -> None:
        super().__init__(settings)
        self.cli = cli or PbsCli(settings.conf, settings.command_timeout_s, settings.bin_dir)

    def version(self) -> str:
        return self.cli.version()

    def nodes(self) -> list[BatchNode]:
        return list(self.cli.nodes())

    def jobs(self, name: str, user: str) -> list[BatchJob]:
        return list(self.cli.jobs(name, user, self.settings.partition))

    def submit(self, node: str, known: Optional[BatchNode], script: str, env: Mapping[str, str]) -> str:
        pbs_node = known if isinstance(known, PbsNode) else None
        return self.cli.submit(qsub_options(self.settings, node, pbs_node), pilot_argv(self.settings, script),
                               {**env, ENV_NODE: node})

    def cancel(self, jobs: Sequence[str]) -> None:
        self.cli.cancel(jobs)

    def cancel_suspended(self, jobs: Sequence[str]) -> None:
        """`qdel -W force`: a plain qdel ends a suspended job in PBS's books but leaves its
        processes stopped for ever (measured on 23.06)."""
        self.cli.cancel(jobs, force=True)

    def log_path(self, job: str) -> str:
        """PBS names the output of a job whose `-o` is a folder `<job id>.OU` (measured, 23.06)."""
        return f"{self.settings.log_dir}/{job}.OU"

    def watch(self, nodes: list[BatchNode]) -> list[str]:
        """Vnodes that take jobs (ncpus > 0; not a multi-vnode host's natural vnode) and are tied
        to no other queue; of those, the ones `settings.watch` names (vnodes or their hosts)."""
        s = self.settings
        queues = self.cli.queues()
        if s.partition not in queues:
            raise SettingError("partition", f"PBS {self.cli.version()} has no queue {s.partition!r} "
                                            f"(it has {', '.join(queues) or 'none'})")
        usable = [n for n in nodes if isinstance(n, PbsNode) and n.ncpus > 0 and n.queue in ("", s.partition)]
        if not usable:
            raise SettingError("partition", f"PBS has no vnode that takes jobs of queue {s.partition!r}")
        if not s.watch:
            return [n.name for n in usable]
        names, hosts = {n.name for n in usable}, {n.address for n in usable}
        unknown = [w for w in s.watch if w not in names and w not in hosts]
        if unknown:
            raise SettingError("watch", f"PBS has no vnode or host named {', '.join(unknown[:5])} that takes "
                                        f"jobs of queue {s.partition!r}")
        return [n.name for n in usable if n.name in s.watch or n.address in s.watch]
