"""The documentation site (mkdocs.yml, docs/) and the README that points into it.

The site is built once, with --strict, into a temporary folder: any MkDocs warning (a broken link
or anchor, a page left out of the nav, a snippet not found) fails the build, and the built pages'
own links and anchors are then checked too. The Reference pages are generated from the code at
build time (docs/hooks/reference.py); the test checks that every option of `python -m app`, every
route of the OpenAPI document and every metric family reached the site.

Every shell block of the README and of the quick starts (docs/start/) carries a marker just above
it: `<!-- tested: tests/test_x.py ... -->` naming the tests that run its commands, or
`<!-- site-specific: why -->` where it needs a site's hosts or cluster."""
from __future__ import annotations

import html.parser
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "hooks"))
import reference  # noqa: E402  (docs/hooks/reference.py: what the site generates)

README_MAX_LINES = 250


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    said = run.stdout + run.stderr
    assert run.returncode == 0, f"mkdocs build --strict failed after {took:.1f} s:\n{said}"
    warnings = [line for line in said.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert not warnings, "\n".join(warnings)
    return out


def test_the_site_builds_with_warnings_as_errors(site):
    for page in ("index.html", "reference/options/index.html", "reference/api/index.html",
                 "reference/metrics/index.html", "evaluation/facility/index.html"):
        assert (site / page).is_file(), page


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for key in ("href", "src"):
            if a.get(key):
                self.links.append(a[key])


def test_every_internal_link_of_the_built_site_resolves(site):
    # 404.html is served from any depth, so its links are absolute to the site's root: not checked
    pages = {p: _Links() for p in site.rglob("*.html")}
    for p, parser in pages.items():
        parser.feed(p.read_text(encoding="utf-8"))
    broken = []
    for p, parser in pages.items():
        if p.name == "404.html" and p.parent == site:
            continue
        for link in parser.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "data:", "javascript:")):
                continue
            target = (p.parent / unquote(parts.path)).resolve() if parts.path else p
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{p.relative_to(site)}: {link}")
            elif parts.fragment and target.suffix == ".html" and target in pages \
                    and parts.fragment not in pages[target].ids:
                broken.append(f"{p.relative_to(site)}: {link} (no such anchor)")
    assert not broken, "\n".join(broken[:50])


def test_the_options_page_has_every_option_of_python_m_app(site):
    text = (site / "reference/options/index.html").read_text(encoding="utf-8")
    parser = reference.parser_of("app.__main__")
    missing = [s for a in parser._actions for s in a.option_strings if s not in text]
    assert not missing, missing
    commands = (site / "reference/commands/index.html").read_text(encoding="utf-8")
    for module in ("app.check", "app.users", "app.harvest_cli", "core.replay", "core.allocator"):
        p = reference.parser_of(module)
        missing = [s for a in p._actions for s in a.option_strings if s not in commands]
        assert not missing, (module, missing)


def test_the_api_page_and_openapi_json_are_the_served_document(site):
    doc = reference.openapi_document()
    assert json.loads((site / "reference/openapi.json").read_text()) == doc
    text = (site / "reference/api/index.html").read_text(encoding="utf-8")
    for path, ops in doc["paths"].items():
        for method in ops:
            if method != "parameters":
                assert f"{method.upper()} {path}" in text, (method, path)
    for name in doc["components"]["schemas"]:
        assert f'id="schema-{name.lower()}"' in text, name


def test_the_metrics_page_has_every_metric_family(site):
    text = (site / "reference/metrics/index.html").read_text(encoding="utf-8")
    families = reference.metric_families()
    assert {"harvest_idle_nodes", "harvest_solver_seconds", "harvest_slurm_pilots"} <= {f["name"] for f in families}
    for f in families:
        for name in reference.exposed_names(f):
            assert name in text, name


def test_the_example_prometheus_rules_name_only_served_metrics():
    rules = yaml.safe_load((ROOT / "docs/operators/prometheus-rules.yml").read_text())
    served = {n for f in reference.metric_families() for n in reference.exposed_names(f)}
    known = served | {"up", "probe_success"}
    functions = {"rate", "increase", "histogram_quantile", "delta", "on", "and", "or", "unless", "sum", "by"}
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert len(exprs) >= 5
    for expr in exprs:
        names = set(re.findall(r"\b([a-z_][a-z0-9_]*)\s*(?:\{|\[|\)|\s|$)", re.sub(r'"[^"]*"', "", expr)))
        metrics = {n for n in names if n.startswith("harvest_") or n in ("up", "probe_success")}
        assert metrics, expr
        assert metrics <= known, (expr, metrics - known)
        assert not (names - known - functions - {"job", "state", "kind", "outcome"}), (expr, names)


def test_the_readme_fits_on_a_few_screens():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    prose = [i + 1 for i, line in enumerate(lines) if len(line) > 100 and not line.startswith(("|", "!["))]
    assert not prose, f"README.md lines over 100 characters outside tables: {prose}"


def test_the_readme_links_point_at_files_that_exist():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not urlsplit(link).scheme]
    assert len(local) > 20
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing
    site_pages = [link for link in local if link.startswith("docs/") and link.endswith(".md")]
    nav = (ROOT / "mkdocs.yml").read_text()
    assert not [p for p in site_pages if p.removeprefix("docs/") not in nav], "README links a page the site leaves out"


SHELL_BLOCK = re.compile(r"(?:<!--\s*(tested|site-specific):(.*?)-->\s*\n)?```(?:sh|bash)\n(.*?)```", re.S)
#: what a command runs, as a test file would name it
PROGRAM = re.compile(r"-m ([\w.]+)|\b(harvest) (\w+)|(examples/\w+\.py)")


def _quick_start_blocks():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs/start").glob("*.md"))]:
        for m in SHELL_BLOCK.finditer(path.read_text()):
            yield path.relative_to(ROOT), m.group(1), " ".join((m.group(2) or "").split()), m.group(3)


def test_every_quick_start_command_is_run_by_a_test_or_marked_site_specific():
    blocks = list(_quick_start_blocks())
    assert len(blocks) >= 4
    for path, kind, note, body in blocks:
        assert kind, f"{path}: a shell block without a tested/site-specific marker:\n{body}"
        named = re.findall(r"tests/[\w/]+\.py", note)
        assert named, f"{path}: the marker names no test: {note}"
        for t in named:
            assert (ROOT / t).is_file(), f"{path}: {t} does not exist"
        if kind == "site-specific":
            continue
        tests_text = "\n".join((ROOT / t).read_text() for t in named)
        tests_text += "\n".join(p.read_text() for p in (ROOT / "tests/support").glob("*.py"))
        for m in PROGRAM.finditer(body):
            program = m.group(1) or m.group(4) or m.group(2)
            assert program in tests_text or program.replace(".", "/") in tests_text, \
                f"{path}: {program!r} is in a block marked tested by {named}, which never run it"
