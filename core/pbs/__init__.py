"""PBS Professional / OpenPBS as a pilot scheduler (core/pilots/base.py): provider.py (the
pilots' qsub options and the PBS side of the interface), cli.py (the PBS commands), parse.py
(reading their JSON) and records.py (vnodes and jobs as read)."""
