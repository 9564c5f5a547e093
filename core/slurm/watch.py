"""Which Slurm nodes the harvester watches: `--slurm-watch` (partitions, node names, hostlists)
checked against what Slurm has, every one inside the pilots' partition."""
from __future__ import annotations

from .cli import SlurmCli, SlurmUnavailable
from .records import SlurmNode
from ..pilots.settings import PilotSettings, SettingError


def resolve_watch(settings: PilotSettings, nodes: list[SlurmNode], cli: SlurmCli) -> list[str]:
    """The nodes to watch, in Slurm's order: those of `settings.watch` (partitions, node names,
    hostlists), or every node of the pilots' partition; all of them must be in that partition."""
    in_partition = [n.name for n in nodes if settings.partition in n.partitions]
    if not in_partition:
        names = sorted({p for n in nodes for p in n.partitions})
        raise SettingError("partition", f"Slurm {cli.version()} has no partition {settings.partition!r} with nodes "
                                        f"(it has {', '.join(names) or 'none'})")
    if not settings.watch:
        return in_partition
    partitions = {p for n in nodes for p in n.partitions}
    known = {n.name for n in nodes}
    wanted: set[str] = set()
    for item in settings.watch:
        if item in partitions:
            wanted |= {n.name for n in nodes if item in n.partitions}
        elif item in known:
            wanted.add(item)
        elif "[" in item:
            try:
                names = cli.hostnames(item)
            except SlurmUnavailable as e:
                raise SettingError("watch", f"cannot expand {item!r}: {e}") from None
            unknown = [n for n in names if n not in known]
            if unknown:
                raise SettingError("watch", f"{item!r} names node(s) Slurm does not have: {', '.join(unknown[:5])}")
            wanted |= set(names)
        else:
            raise SettingError("watch", f"Slurm has no partition or node named {item!r}")
    outside = sorted(wanted - set(in_partition))
    if outside:
        raise SettingError("watch", f"{', '.join(outside[:5])} not in partition {settings.partition!r}: "
                                    f"no pilot could run there")
    return [n for n in in_partition if n in wanted]
