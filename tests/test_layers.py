"""The HTTP face stays a shell: routes parse, call a use case (``lmsp.app``) and render;
they never reach the database, the model host or the runner themselves, and what only
HTTP keeps (console sessions, the token cache, refusals) is not the running service's.
The import rules themselves (app imports no web framework, layers point down) are
import-linter's contracts, checked by ``make lint``."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import lmsp
from lmsp.app.core import Core

ROUTES = Path(lmsp.__file__).parent / "api" / "routes"
#: what a route may not touch, whatever holds it: the database and its connections, the
#: runner, the broker, the prefix cache, the cluster's lease (the use cases do)
ANYWHERE = {"db", "reader", "submit", "runner", "broker", "kv", "membership"}
#: the running service's other parts a route may not touch (``host`` and ``files`` are
#: also the names of a URL's host and a package's files)
OF_SERVICE = {"host", "files", "webhooks", "sandbox", "grammars", "readers"}


def _is_service(node: ast.expr) -> bool:
    """``svc``, ``core`` or ``service(request)``: the running service in a route."""
    if isinstance(node, ast.Name):
        return node.id in ("svc", "core")
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "service"


def _reaches(tree: ast.AST) -> list[tuple[str, int, str]]:
    """``(function, line, part)`` of each part of the service a route module reads."""
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            if not isinstance(node, ast.Attribute):
                continue
            if node.attr in ANYWHERE or (node.attr in OF_SERVICE and _is_service(node.value)):
                found.append((func.name, node.lineno, node.attr))
    return found


def test_no_route_reaches_past_the_use_cases() -> None:
    reached = []
    for module in sorted(ROUTES.glob("*.py")):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        for name, line, part in _reaches(tree):
            reached.append(f"{module.name}:{line} {name} reads .{part}")
    assert reached == []


def test_the_running_service_keeps_no_http_state() -> None:
    kept = {f.name for f in fields(Core)}
    assert not kept & {"console", "tokens", "refusals"}
