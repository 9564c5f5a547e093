"""What the tests share that is not a fixture: the daemons they start on loopback (server, sshd,
slurm and the Slurm namespace's init), the one way to wait (waiting), small input files (files),
simulated jobs and controllers (sim) and process helpers (procs). Fixtures live in
tests/conftest.py; a test module imports from here, never from another test module."""
