# Two commands for a new user: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DEMO_ARGS ?=
# pytest-xdist workers for `make test` (tests/conftest.py: modules whole, the host-resource group first)
TEST_JOBS ?= 2

.PHONY: demo test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.runtime: requirements.txt | $(PY)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.dev: requirements-dev.txt $(VENV)/.runtime
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

# The dashboard on http://127.0.0.1:8050 replaying the Summit trace (DEMO_ARGS="--speed 600 ...").
demo: $(VENV)/.runtime
	$(PY) -m app $(DEMO_ARGS)

# Browser tests drive Debian's chromium through Playwright (no browser download needed);
# the SSH tests start their own sshd on loopback; the run-as tests make a Unix account and use sudo; the Slurm tests their own munged, slurmctld
# and slurmd, once with Debian 12's Slurm 22.05 and once with Debian 13's 24.11 in a chroot that debootstrap builds on first use and
# keeps in /var/cache/harvest-tests, and for QOS preemption their own MariaDB and slurmdbd; the PBS tests their own OpenPBS daemons
# in a network namespace, OpenPBS built once from ../shared/vendor into /var/cache/harvest-tests (minutes, the first time). lint-imports checks the architecture contract (.importlinter).
test: $(VENV)/.dev
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
	@test -x /usr/sbin/sshd || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null; }
	@test -x /usr/sbin/ip || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null; }
	@command -v sudo >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sudo >/dev/null; }
	@test -x /usr/sbin/slurmctld || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; }
	@test -x /usr/sbin/debootstrap || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
	@test -x /usr/sbin/slurmdbd -a -x /usr/sbin/mariadbd || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server slurmdbd >/dev/null; }
	$(PY) -m tests.support.openpbs build >/dev/null
	$(VENV)/bin/lint-imports --no-logo --no-cache
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadscope

bench: $(VENV)/.dev
	$(PY) -m bench.allocator
	$(PY) -m bench.replay
	$(PY) -m bench.dashboard
	$(PY) -m bench.rescale
	$(PY) -m bench.vacate
	$(PY) -m bench.slurm
	$(PY) -m bench.pbs
	$(PY) -m bench.coldstart
	$(PY) -m bench.facility
	$(PY) -m bench.scale
	$(PY) -m bench.preemption
	$(PY) -m bench.jpa
	$(PY) -m bench.fairshare
	$(PY) -m bench.faults
	$(PY) -m bench.startup
	$(PY) -m bench.metrics

clean:
	rm -rf $(VENV) .pytest_cache
