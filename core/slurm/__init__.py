"""Slurm as a pilot scheduler (core/pilots/base.py): provider.py (the pilots' sbatch options and
the Slurm side of the interface), cli.py (the Slurm commands), parse.py (reading their output,
the same for every supported version), records.py (nodes and jobs as read) and watch.py (which
nodes are watched)."""
