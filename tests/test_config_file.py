"""The configuration file of `python -m app` (issue 50, item 1): a TOML file of options named
after the flags, HARVEST_<OPTION> variables over it and flags over those; `--print-config` says
where each value came from; a bad key or value is one line naming the file and the key. Real
files, real processes: the harvester started from a file only, then with one key overridden by
the environment and one by a flag."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import InputError
from core.settings import Options, OptionError, WebSettings
from tests.support.files import ROOT
from tests.support.ports import free_port
from tests.support.server import start_app, write_users

DEPLOY = ROOT / "deploy"


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any HARVEST_ variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARVEST_")}
    return {**env, **extra}


def app(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env if env is not None else clean_env())


def printed(text: str) -> dict[str, tuple[str, str]]:
    """--print-config's lines: {option: (value as written, where from)}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(#\s*)?(\w+) = (.*?)\s+# (.+)$", line)
        if m:
            out[m.group(2)] = ("" if m.group(1) else m.group(3).strip(), m.group(4))
    return out


def test_a_file_with_one_line_is_a_configuration(tmp_path):
    conf = tmp_path / "harvester.toml"
    conf.write_text("port = 8123\n")
    r = app("--config", str(conf), "--print-config")
    assert r.returncode == 0, r.stderr
    rows = printed(r.stdout)
    assert rows["port"] == ("8123", f"file {conf} (port)")
    assert rows["host"] == ('"127.0.0.1"', "default")
    assert set(rows) == set(Options.model_fields) - {"config"}, "every option is shown"


def test_file_env_and_flag_each_shown_from_its_source_and_in_force(tmp_path):
    """The harvester starts from a file only, then with max_jobs from HARVEST_MAX_JOBS and the
    policy from --policy: --print-config names each one's source, and the running harvester
    (GET /api/cluster) uses exactly those values."""
    port = free_port()
    users = write_users(tmp_path / "users.json")
    conf = tmp_path / "harvester.toml"
    conf.write_text(f'# a replay of 40 nodes\nport = {port}\nhost = "127.0.0.1"\ndb = "{tmp_path / "h.db"}"\n'
                    f'users = "{users}"\nlog_format = "json"\n\n[replay]\nnodes = 40\nhours = 1\n'
                    'max-jobs = 3\npolicy = "even"\nspeed = 30\n\n[web]\nthreads = 4\n')
    r = app("--config", str(conf), "--print-config")
    assert r.returncode == 0, r.stderr
    rows = printed(r.stdout)
    assert rows["port"] == (str(port), f"file {conf} (port)")
    assert rows["max_jobs"] == ("3", f"file {conf} (replay.max-jobs)")
    assert rows["policy"] == ('"even"', f"file {conf} (replay.policy)")
    assert rows["threads"] == ("4", f"file {conf} (web.threads)")

    env = clean_env(HARVEST_MAX_JOBS="5")
    r = app("--config", str(conf), "--policy", "greedy", "--print-config", env=env)
    assert r.returncode == 0, r.stderr
    rows = printed(r.stdout)
    assert rows["max_jobs"] == ("5", "env HARVEST_MAX_JOBS")
    assert rows["policy"] == ('"greedy"', "flag --policy")
    assert rows["port"] == (str(port), f"file {conf} (port)")
    assert rows["speed"] == ("30.0", f"file {conf} (replay.speed)")
    assert r.stdout.splitlines()[0].startswith("# python -m app") and f"# file: {conf}" in r.stdout

    # the same, running: start_app adds --port/--db/--users flags, so start it by hand
    proc = subprocess.Popen([sys.executable, "-m", "app", "--config", str(conf), "--policy", "greedy"], cwd=tmp_path,
                            env={**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        import json
        import time
        import urllib.request
        deadline, body = time.monotonic() + 90, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/cluster?nodes=0", timeout=5) as resp:
                    body = json.loads(resp.read())
                break
            except OSError:
                time.sleep(0.3)
        assert body is not None, proc.communicate(timeout=30)
        assert body["config"]["policy"] == "greedy", body["config"]
        assert body["config"]["max_jobs"] == 5, body["config"]
        assert body["speed"] == 30.0
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert (tmp_path / "h.db").exists(), "the store is the file's db"
    assert "state saved" in out


@pytest.mark.parametrize("content, words", [
    ("prot = 8123\n", "{f}: prot: unknown setting (did you mean port?)"),
    ("port = \"eighty\"\n", "{f}: port: Input should be a valid integer"),
    ("port = 70000\n", "{f}: port: must be a port number from 0"),
    ("[web]\nthreads = 0\n", "{f}: web.threads: must be at least 1, not 0"),
    ("[replay]\nhours = -1\n", "{f}: replay.hours: must be positive"),
    ("max_jobs = 0\n", "{f}: max_jobs: must be a whole number of at least 1"),
    ("tfwd = \"soon\"\n", "{f}: tfwd: give seconds or auto, not 'soon'"),
    ("source = \"slrum\"\n", "{f}: source: Input should be 'static', 'slurm' or 'pbs'"),
    ("dispatch = \"local\"\n", "{f}: local_nodes: live mode needs local_nodes N or nodes FILE"),
    ("dispatch = \"local\"\nlocal_nodes = 2\n[live]\nlocal_slots = 0\n", "{f}: live.local_slots: must be a whole"),
    ("[webb]\nthreads = 2\n", "{f}: [webb]: unknown table"),
    ("[web.tls]\non = true\n", "{f}: web.tls: a table within a table"),
    ("port = 1\n[web]\nport = 2\n", "{f}: web.port: given twice (also as port)"),
    ("config = \"other.toml\"\n", "{f}: config: unknown setting (--config names the file"),
    ("port = \n", "{f}: not valid TOML: Invalid value (at line 1, column 8)"),
])
def test_a_bad_key_or_value_is_one_line_naming_the_file_and_key(tmp_path, content, words):
    conf = tmp_path / "bad.toml"
    conf.write_text(content)
    for extra in ((), ("--print-config",)):
        r = app("--config", str(conf), *extra, env=clean_env(PYTHONPATH=str(ROOT)), cwd=tmp_path)
        assert r.returncode == 2, (r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert lines[0].startswith("error: " + words.format(f=conf)), lines[0]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"], "a refused start leaves no file behind"


def test_environment_and_flag_errors_name_the_variable_and_the_flag(tmp_path):
    r = app("--print-config", env=clean_env(HARVEST_PORT="http"))
    assert r.returncode == 2 and r.stderr.startswith("error: HARVEST_PORT: Input should be a valid integer"), r.stderr
    r = app("--print-config", env=clean_env(HARVEST_HOURS="-2"))
    assert r.returncode == 2 and r.stderr.strip() == "error: HARVEST_HOURS: must be positive, not -2.0", r.stderr
    r = app("--print-config", "--threads", "0")
    assert r.returncode == 2 and r.stderr.strip() == "error: --threads: must be at least 1, not 0", r.stderr
    r = app("--config", str(tmp_path / "missing.toml"), "--print-config")
    assert r.returncode == 2 and r.stderr.startswith(f"error: {tmp_path / 'missing.toml'}: cannot read"), r.stderr
    # HARVEST_CONFIG names the file as --config does
    conf = tmp_path / "c.toml"
    conf.write_text("port = 9\n")
    r = app("--print-config", env=clean_env(HARVEST_CONFIG=str(conf)))
    assert r.returncode == 0 and printed(r.stdout)["port"] == ("9", f"file {conf} (port)"), r.stdout + r.stderr


def test_secrets_are_masked_and_the_users_file_variable_is_kept(tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text('secret_key = "s3cret-s3cret-s3cret-s3cret-s3cret"\n')
    users = write_users(tmp_path / "u.json")
    r = app("--config", str(conf), "--print-config", env=clean_env(HARVEST_USERS_FILE=str(users),
                                                                     HARVEST_USERS='{"users": []}'))
    assert r.returncode == 0, r.stderr
    assert "s3cret" not in r.stdout
    rows = printed(r.stdout)
    assert rows["secret_key"] == ('"********"', f"file {conf} (secret_key)")
    assert rows["users"] == (f'"{users}"', "env HARVEST_USERS_FILE"), "HARVEST_USERS holds accounts, not a path"


def test_lists_dates_and_dashes_read_as_the_flags_do(tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text('worker-env = ["LD_LIBRARY_PATH", "NCCL_DEBUG"]\nstart = 2021-02-11T00:00:00Z\n'
                    '[slurm]\nwatch = ["p1", "n[1-4]"]\nhub = "10.0.0.1:7000"\n')
    o = Options.load({"config": conf})
    assert o.worker_env == "LD_LIBRARY_PATH,NCCL_DEBUG" and o.slurm_watch == "p1,n[1-4]"
    assert o.start == "2021-02-11T00:00:00Z" and o.slurm_hub == "10.0.0.1:7000"
    assert o.origin("worker_env").kind == "file" and o.origin("worker_env").name == "worker-env"


def test_the_options_and_the_flags_are_the_same_set():
    """Every flag is a key (and HARVEST_ variable) and every key but the file-only ones a flag,
    with the same default: the parser takes its defaults from Options."""
    from app.__main__ import build_parser
    ap = build_parser()
    dests = {a.dest: a for a in ap._actions if a.dest not in ("help", "print_config")}
    fields = Options.model_fields
    assert set(dests) == set(fields) - {"secret_key"}, set(dests) ^ (set(fields) - {"secret_key"})
    for name, action in dests.items():
        assert action.default == fields[name].default, name
    from app.webconfig import WebConfig
    w = WebSettings()
    assert WebConfig() == WebConfig.of(w)


def test_the_example_configuration_is_valid_and_read_from_the_file():
    """As on its head, where head01.example.org is this machine: here the servers for the nodes
    listen on loopback (HARVEST_BIND), since nothing can listen on a name this machine does not
    know (core/listeners.py; tests/test_listeners.py); nor is the name looked up then."""
    r = app("--config", str(DEPLOY / "harvester.toml"), "--print-config", env=clean_env(HARVEST_BIND="127.0.0.1"))
    assert r.returncode == 0, r.stderr
    rows = printed(r.stdout)
    for key in ("port", "db", "users", "log_format", "secure_cookies", "source", "slurm_partition"):
        assert rows[key][1].startswith(f"file {DEPLOY / 'harvester.toml'}"), (key, rows[key])


def test_unreadable_file_errors_are_input_errors(tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_bytes(b"port = 1\n\xff\xfe\n")
    with pytest.raises(InputError, match="not a UTF-8 text file"):
        Options.load({"config": conf})
    with pytest.raises(OptionError, match="^--port: must be a port number"):
        Options.load({"port": -1})
