"""MkDocs hook: the Reference pages written from the code at build time, so they cannot drift.

A page asks for a generated part with a marker on a line of its own:

    <!-- generate: options app.__main__ -->    the options of a command, from its argparse parser
    <!-- generate: openapi -->                 the HTTP API, from app.openapi.document()
    <!-- generate: metrics -->                 the Prometheus metrics, read from app/metrics.py

A parser is taken from the module's `build_parser()`, or else caught as its `main()` builds it
(parse_args is stopped before it parses anything). The OpenAPI document is also written to the
site as `reference/openapi.json`. Anything that cannot be generated stops the build: a page that
silently lost its reference would be worse than no page.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generate: (\w+)(?: ([\w.]+))? -->$", re.M)


class _Caught(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _on_path() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def parser_of(module_name: str) -> argparse.ArgumentParser:
    """The module's command-line parser: build_parser(), or the one main() builds."""
    _on_path()
    module = importlib.import_module(module_name)
    if hasattr(module, "build_parser"):
        return module.build_parser()

    def catch(self, *_a, **_k):
        raise _Caught(self)
    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = catch
    try:
        takes_argv = bool(inspect.signature(module.main).parameters)
        with contextlib.redirect_stdout(None):
            module.main([]) if takes_argv else module.main()
    except _Caught as c:
        return c.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
    raise RuntimeError(f"{module_name}: main() built no argparse parser")


def _md(text: str) -> str:
    """Help text as one table cell: no pipes or line breaks, and this machine's paths named."""
    text = " ".join(str(text).split())
    text = text.replace(sys.executable, "this Python").replace(str(ROOT) + os.sep, "")
    return text.replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    d = action.default
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off" if isinstance(action, argparse._StoreTrueAction) else "on"
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or d is None or d is argparse.SUPPRESS:
        return ""
    if d == "" or d == ():
        return ""
    if isinstance(d, Path) or isinstance(d, str):
        d = str(d)
        if d == sys.executable:
            return "this Python"
        d = d.replace(str(ROOT) + os.sep, "")
    elif isinstance(d, float) and d.is_integer():
        d = int(d)
    return f"`{d}`"


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    names = " / ".join(f"`{s}`" for s in action.option_strings)
    if action.nargs == 0:
        return names
    if action.choices and not action.metavar:
        return f"{names} `{'|'.join(str(c) for c in action.choices)}`"
    metavar = action.metavar or action.dest.upper()
    if action.nargs == "?":
        return f"{names} `[{metavar}]`"
    return f"{names} `{metavar}`"


def _actions_table(actions) -> list[str]:
    rows = [a for a in actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    if not rows:
        return []
    out = ["| option | default | meaning |", "|---|---|---|"]
    for a in rows:
        help_ = "" if a.help in (None, argparse.SUPPRESS) else a.help
        if help_ and "%(" in help_:
            help_ = help_ % {**vars(a), "prog": ""}
        out.append(f"| {_invocation(a)} | {_md(_default(a))} | {_md(help_)} |")
    return out


def options_markdown(module_name: str) -> str:
    """Every option of a command, a table per argument group (and per subcommand)."""
    parser = parser_of(module_name)
    out: list[str] = []

    def one(p: argparse.ArgumentParser, level: int) -> None:
        usage = " ".join(p.format_usage().split())
        usage = usage.removeprefix("usage: ").replace(sys.executable, "python")
        out.extend([f"```text\n{usage}\n```", ""])
        if p.description:
            out.extend([_md(p.description), ""])
        for group in p._action_groups:
            table = _actions_table(group._group_actions)
            if not table:
                continue
            title = group.title or "options"
            if title not in ("options", "optional arguments", "positional arguments"):
                out.extend([f"{'#' * (level + 1)} {title[0].upper()}{title[1:]}", ""])
            out.extend(table + [""])
        if p.epilog:
            out.extend([_md(p.epilog), ""])
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                helps = {c.dest: c.help for c in a._choices_actions}
                for name, sub in a.choices.items():
                    out.extend([f"{'#' * (level + 1)} `{name}`", ""])
                    if helps.get(name):
                        out.extend([_md(helps[name][0].upper() + helps[name][1:]) + ".", ""])
                    one(sub, level + 1)
    one(parser, 2)
    return "\n".join(out)


# ---- the HTTP API ---------------------------------------------------------------------------------

def openapi_document() -> dict:
    _on_path()
    from app.openapi import document
    return document()


def _schema_type(s: dict) -> str:
    if "$ref" in s:
        name = s["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#schema-{name.lower()})"
    if "anyOf" in s:
        return " or ".join(_schema_type(x) for x in s["anyOf"])
    t = s.get("type", "any")
    if t == "array":
        return f"array of {_schema_type(s.get('items', {}))}"
    if "enum" in s:
        return " \\| ".join(f"`{v}`" for v in s["enum"])
    return t


def _constraints(s: dict) -> str:
    words = []
    for key, word in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"),
                      ("minLength", "length ≥"), ("maxLength", "length ≤"), ("minItems", "items ≥"),
                      ("maxItems", "items ≤")):
        if key in s:
            words.append(f"{word} {s[key]}")
    if "pattern" in s:
        words.append(f"pattern `{s['pattern']}`")
    for alt in s.get("anyOf", []):
        c = _constraints(alt)
        if c:
            words.append(c)
    return ", ".join(words)


def _schema_markdown(name: str, s: dict) -> list[str]:
    out = [f'### {name} {{#schema-{name.lower()}}}', ""]
    if s.get("description"):
        out.extend([_md(s["description"]), ""])
    props = s.get("properties")
    if not props:
        out.extend([f"Type: {_schema_type(s)}.", ""])
        return out
    required = set(s.get("required", ()))
    out.extend(["| field | type | required | default | rules | meaning |", "|---|---|---|---|---|---|"])
    for field, p in props.items():
        default = f"`{json.dumps(p['default'])}`" if "default" in p else ""
        out.append(f"| `{field}` | {_schema_type(p)} | {'yes' if field in required else ''} | {_md(default)} | "
                   f"{_md(_constraints(p))} | {_md(p.get('description', p.get('title', '')))} |")
    return out + [""]


def openapi_markdown() -> str:
    doc = openapi_document()
    info = doc["info"]
    out = [f"{_md(info.get('description', ''))} OpenAPI {doc['openapi']}, "
           f"[as JSON](openapi.json) (the server serves the same at `GET /api/openapi.json`).", ""]
    out.extend(["| method | path | what |", "|---|---|---|"])
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method == "parameters":
                continue
            anchor = re.sub(r"[^a-z0-9]+", "-", f"{method} {path}".lower()).strip("-")
            out.append(f"| {method.upper()} | [`{path}`](#{anchor}) | {_md(op.get('summary', ''))} |")
    out.append("")
    for path, ops in doc["paths"].items():
        shared = ops.get("parameters", [])
        for method, op in ops.items():
            if method == "parameters":
                continue
            anchor = re.sub(r"[^a-z0-9]+", "-", f"{method} {path}".lower()).strip("-")
            out.extend([f"## `{method.upper()} {path}` {{#{anchor}}}", ""])
            if op.get("summary"):
                out.extend([_md(op["summary"][0].upper() + op["summary"][1:]) + ".", ""])
            if op.get("description"):
                out.extend([_md(op["description"]), ""])
            if op.get("security"):
                out.extend(["Needs a bearer token (or the dashboard's login session).", ""])
            params = shared + op.get("parameters", [])
            if params:
                out.extend(["| parameter | in | type | required | meaning |", "|---|---|---|---|---|"])
                for p in params:
                    sch = p.get("schema", {})
                    rules = _constraints(sch)
                    what = _md(p.get("description", "")) + (f" ({_md(rules)})" if rules else "")
                    out.append(f"| `{p['name']}` | {p['in']} | {_schema_type(sch)} | "
                               f"{'yes' if p.get('required') else ''} | {what} |")
                out.append("")
            body = op.get("requestBody")
            if body:
                for media, m in body.get("content", {}).items():
                    req = "" if body.get("required", True) else " (optional)"
                    out.extend([f"Body{req}: `{media}`, {_schema_type(m.get('schema', {}))}. "
                                f"{_md(body.get('description', ''))}".rstrip(), ""])
            out.extend(["| status | meaning | body |", "|---|---|---|"])
            for status, r in op.get("responses", {}).items():
                content = r.get("content", {})
                kinds = ", ".join(f"`{media}` {_schema_type(m.get('schema', {}))}" for media, m in content.items())
                headers = ", ".join(f"header `{h}`" for h in r.get("headers", {}))
                out.append(f"| {status} | {_md(r.get('description', ''))} | {', '.join(x for x in (kinds, headers) if x)} |")
            out.append("")
    out.extend(["## Schemas", ""])
    for name, s in doc.get("components", {}).get("schemas", {}).items():
        out.extend(_schema_markdown(name, s))
    return "\n".join(out)


# ---- the metrics ------------------------------------------------------------------------------------

FAMILIES = {"GaugeMetricFamily": "gauge", "CounterMetricFamily": "counter", "HistogramMetricFamily": "histogram"}


def metric_families() -> list[dict]:
    """Every metric family app/metrics.py builds, read from its source: name, type, help, labels."""
    tree = ast.parse((ROOT / "app" / "metrics.py").read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FAMILIES:
            args = [ast.literal_eval(a) for a in node.args[:2]]
            labels = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "labels"), [])
            found.append({"name": args[0], "type": FAMILIES[node.func.id], "help": args[1], "labels": labels,
                          "line": node.lineno})
    if not found:
        raise RuntimeError("app/metrics.py: no metric families found")
    return sorted(found, key=lambda f: f["line"])


def exposed_names(family: dict) -> list[str]:
    """The series names Prometheus scrapes for a family (a counter gains _total, a histogram its parts)."""
    n = family["name"]
    if family["type"] == "counter":
        return [n + "_total"]
    if family["type"] == "histogram":
        return [n + "_bucket", n + "_sum", n + "_count"]
    return [n]


def metrics_markdown() -> str:
    out = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for f in metric_families():
        names = ", ".join(f"`{x}`" for x in exposed_names(f))
        labels = ", ".join(f"`{x}`" for x in f["labels"])
        out.append(f"| {names} | {f['type']} | {labels} | {_md(f['help'])} |")
    _on_path()
    try:
        from core.snapshot import SOLVE_BUCKETS_S
        out.extend(["", "`harvest_solver_seconds` buckets (seconds): "
                    + ", ".join(f"{b:g}" for b in SOLVE_BUCKETS_S) + ", +Inf."])
    except ImportError:
        pass
    return "\n".join(out)


# ---- the hook -----------------------------------------------------------------------------------------

def generate(kind: str, arg: str | None) -> str:
    if kind == "options" and arg:
        return options_markdown(arg)
    if kind == "openapi":
        return openapi_markdown()
    if kind == "metrics":
        return metrics_markdown()
    raise ValueError(f"unknown generated part {kind!r}")


def on_page_markdown(markdown, page, config, files):
    if "<!-- generate:" not in markdown:
        return markdown
    return MARKER.sub(lambda m: generate(m.group(1), m.group(2)), markdown)


def on_files(files, config):
    from mkdocs.structure.files import File
    files.append(File.generated(config, "reference/openapi.json",
                                content=json.dumps(openapi_document(), indent=2) + "\n"))
    return files
