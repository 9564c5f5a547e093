"""bench.dashboard --quick: `make bench`'s dashboard benchmark runs end to end (a real app, a real
Chromium page, every update and worst case accepted by the server), so a change to the callback
input rules or the grid callback cannot break it silently again (issue 50)."""
from __future__ import annotations

import json

from app import callback_inputs, ids
from bench.dashboard import other_boot
from tests.support.procs import run_module
from tests.support.server import browser_or_skip

browser_or_skip()


def test_every_key_the_bench_sends_is_one_a_browser_can_hold():
    """The worst case 'another process's key' passes the same rule as the key a page holds; the
    old seq -1 (no snapshot has one) is what the rule rightly refused."""
    rule = callback_inputs.rule_for(ids.GRID_KEY, "data")
    key = {"boot": "51c7887a", "seq": 8, "machine": "4734-6414ef5e"}
    assert rule(key) and rule(other_boot(key)) and rule(None)
    assert other_boot(key)["boot"] != key["boot"] and other_boot(other_boot(key))["boot"] != "00000000"
    assert not rule({**key, "seq": -1})


def test_quick_run_measures_every_path():
    r = run_module("bench.dashboard", "--quick", "--json", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads(r.stdout.strip().splitlines()[-1])
    sent = s["grid_key_sent"]           # captured from the real page's own grid callback request
    assert set(sent) == {"boot", "seq", "machine"} and isinstance(sent["seq"], int) and sent["seq"] >= 0, sent
    assert callback_inputs.rule_for(ids.GRID_KEY, "data")(sent)
    assert s["updates"] == 3 and s["worst_repeats"] == 3 and s["first_render_loads"] == 1
    assert sum(s["update_kinds"].values()) == 3 and sum(s["diff_kinds"].values()) == 3
    assert s["full_kb"] > s["ztext_kb"] > 0        # the whole figure, then the whole z and text
    assert s["inproc_update_compute_ms_p50"] > 0 and s["cells_of_ms_p50"] > 0
    assert "grid update as a browser sends it" in r.stdout
