"""Slurm as a pilot scheduler (core/pilots/base.py): nodes from sinfo, pilots from squeue, each
pilot a one-node exclusive sbatch job pinned with --nodelist to the partition Slurm preempts,
not requeued (--no-requeue: a preempted pilot is over, its node the main job's)."""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from ..pilots.base import BatchJob, BatchNode, Scheduler
from ..pilots.script import log_path
from ..pilots.settings import PilotSettings
from .cli import SlurmCli
from .records import SlurmNode
from .watch import resolve_watch


def sbatch_options(s: PilotSettings, node: str, known: Optional[SlurmNode]) -> list[str]:
    """One node, exclusive, the node's GPUs (so Slurm binds them to the pilot), QOS and account."""
    opts = ["--partition", s.partition, "--job-name", s.pilot_name, "--nodelist", node, "--nodes", "1",
            "--ntasks", "1", "--exclusive", "--time", str(s.time_limit_min), "--chdir", s.workdir,
            "--output", log_path(s, "%j") if s.log_dir else "/dev/null", "--export", "ALL", "--no-requeue"]
    if known is not None and known.gpus:
        opts += ["--gres", f"gpu:{known.gpus}"]
    if s.qos:
        opts += ["--qos", s.qos]
    if s.account:
        opts += ["--account", s.account]
    return opts


class SlurmScheduler(Scheduler):
    name = "slurm"
    title = "Slurm"
    queue_word = "partition"

    def __init__(self, settings: PilotSettings, cli: Optional[SlurmCli] = None) -> None:
        super().__init__(settings)
        self.cli = cli or SlurmCli(settings.conf, settings.command_timeout_s, settings.bin_dir)

    def version(self) -> str:
        return str(self.cli.version())

    def nodes(self) -> list[BatchNode]:
        return list(self.cli.nodes())

    def jobs(self, name: str, user: str) -> list[BatchJob]:
        return list(self.cli.jobs(name, user))

    def submit(self, node: str, known: Optional[BatchNode], script: str, env: Mapping[str, str]) -> str:
        slurm_node = known if isinstance(known, SlurmNode) else None
        return self.cli.submit(sbatch_options(self.settings, node, slurm_node), script, env)

    def cancel(self, jobs: Sequence[str]) -> None:
        self.cli.cancel(jobs)

    def watch(self, nodes: list[BatchNode]) -> list[str]:
        return resolve_watch(self.settings, [n for n in nodes if isinstance(n, SlurmNode)], self.cli)
