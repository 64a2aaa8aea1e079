"""The create routes answered below the router (:mod:`lmsp.api.direct`) answer as the
framework's routes do: the same requests, good and bad, sent to the app both ways
(``create_app(fast=False)`` routes them through FastAPI as every other route), give the
same status, headers and error bodies; the answers are counted under their route."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from lmsp.api.app import DIRECT_ROUTES, create_app
from lmsp.api.routes import chat, completions, messages, responses
from lmsp.config import Settings
from lmsp.store import clients

MODEL = "lmsp-test"

#: a body each route takes
GOOD: dict[str, dict[str, Any]] = {
    "/v1/responses": {"model": MODEL, "input": "hello"},
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": MODEL, "prompt": "hello", "max_tokens": 4},
    "/v1/messages": {
        "model": MODEL,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    },
}

#: (name, headers, raw body or JSON value, with the owner's token); the token ``"reader"``
#: holds ``responses:read`` only
CASES: list[tuple[str, dict[str, str], Any, str | None]] = [
    ("no token", {}, "GOOD", None),
    ("a token without the scope", {}, "GOOD", "reader"),
    ("a token in x-api-key", {}, "GOOD", "x-api-key"),
    ("an unknown token", {"Authorization": "Bearer lmsp_nope"}, "GOOD", None),
    ("no body", {}, b"", "owner"),
    ("a body of spaces", {}, b"   ", "owner"),
    ("not JSON", {}, b"{", "owner"),
    ("not JSON and no token", {}, b"{", None),
    ("not UTF-8", {}, b'{"model": "\xff"}', "owner"),
    ("a JSON list", {}, [], "owner"),
    ("a JSON string", {}, "text", "owner"),
    ("a field of the wrong type", {}, {"model": 5}, "owner"),
    ("no model", {}, {"input": "x", "messages": [], "prompt": "x"}, "owner"),
    ("an unknown field", {}, "GOOD+frobnicate", "owner"),
    ("an unknown model", {}, "GOOD+model", "owner"),
    ("a lone surrogate", {}, b'{"model": "\\ud800"}', "owner"),
    ("a form's content type", {"Content-Type": "text/plain"}, "GOOD", "owner"),
    ("an idempotency key", {"Idempotency-Key": "direct-1"}, "GOOD", "owner"),
    ("the same key again", {"Idempotency-Key": "direct-1"}, "GOOD", "owner"),
    ("background", {}, "GOOD+background", "owner"),
    ("a stream", {}, "GOOD+stream", "owner"),
]

_IDS = re.compile(r"\b(resp|task|msg|chatcmpl|cmpl|item|fc|call|req)[_-][A-Za-z0-9]+")
_NUMBERS = re.compile(r'"(created_at|created|completed_at|seed|request_id)":\s*("\w+"|[0-9.]+)')


def _body(path: str, spec: Any) -> dict[str, Any] | bytes | Any:
    if not isinstance(spec, str) or not spec.startswith("GOOD"):
        return spec
    body = dict(GOOD[path])
    extra = spec.partition("+")[2]
    if extra == "frobnicate":
        body["frobnicate"] = 1
    elif extra == "model":
        body["model"] = "no-such-model"
    elif extra in ("background", "stream"):
        if path != "/v1/responses" and extra == "background":
            body["metadata"] = {"k": "v"}  # the others have no background mode
        else:
            body[extra] = True
    return body


def _answers(settings: Settings, fast: bool) -> list[tuple[Any, ...]]:
    seen: list[tuple[Any, ...]] = []
    with TestClient(create_app(settings, fast=fast)) as http:
        owner = (settings.data_dir / "owner.token").read_text().strip()
        svc = http.app.state.lmsp  # type: ignore[attr-defined]
        reader = svc.db.write_sync(lambda c: clients.add(c, "reader", ["responses:read"])[1])
        tokens = {"owner": owner, "reader": reader}
        for path in GOOD:
            for name, headers, spec, who in CASES:
                sent = dict(headers)
                if "Idempotency-Key" in sent:  # a key of this run's own, the same twice
                    sent["Idempotency-Key"] += f"-{fast}{path}"
                if who == "x-api-key":
                    sent["x-api-key"] = owner
                elif who is not None:
                    sent["Authorization"] = f"Bearer {tokens[who]}"
                body = _body(path, spec)
                if isinstance(body, bytes):
                    answer = http.post(path, content=body, headers=sent)
                else:
                    answer = http.post(path, json=body, headers=sent)
                text = _NUMBERS.sub(r'"\1":0', _IDS.sub(r"\1_x", answer.text))
                if answer.status_code < 300:  # sampled: its text differs run by run
                    text = ",".join(sorted(answer.json())) if answer.text[:1] == "{" else "stream"
                kept = {
                    k: _IDS.sub(r"\1_x", v)
                    for k, v in answer.headers.items()
                    if k in ("content-type", "location", "idempotent-replayed", "www-authenticate")
                }
                seen.append((path, name, answer.status_code, kept, text))
        metrics = http.get("/metrics").text
        seen.append(("metrics", sorted(set(re.findall(r'route="(/v1/[a-z/]+)"', metrics)))))
    return seen


@pytest.fixture
def both(settings: Settings) -> Iterator[tuple[list[Any], list[Any]]]:
    direct = _answers(settings, fast=True)
    routed = _answers(settings, fast=False)  # the same data directory, after the first
    yield direct, routed


def test_the_direct_routes_answer_as_the_framework_does(
    both: tuple[list[Any], list[Any]],
) -> None:
    direct, routed = both
    assert len(direct) == len(routed) == len(GOOD) * len(CASES) + 1
    for one, other in zip(direct, routed, strict=True):
        assert one == other
    statuses = {(path, name): status for path, name, status, *_ in direct[:-1]}
    # the cases do reach what they are for, on every route
    for path in GOOD:
        assert statuses[(path, "no token")] == 401
        assert statuses[(path, "a token without the scope")] == 403
        assert statuses[(path, "not JSON and no token")] == 400  # the body is read first
        assert statuses[(path, "a field of the wrong type")] == 400
        assert statuses[(path, "an idempotency key")] == 200
    assert statuses[("/v1/responses", "background")] == 202
    assert statuses[("/v1/messages", "a token in x-api-key")] == 200
    assert statuses[("/v1/responses", "a token in x-api-key")] == 401
    assert direct[-1][1] == sorted(GOOD)  # each counted under its own route


def test_every_direct_route_is_the_framework_route_of_its_path(settings: Settings) -> None:
    """Each direct route names the endpoint, body model and scope FastAPI declares for
    ``POST`` on its path (the OpenAPI document's security lists the scope)."""
    schema = create_app(settings).openapi()
    declared = [
        r
        for router in (responses.router, chat.router, completions.router, messages.router)
        for r in router.routes
        if isinstance(r, APIRoute) and "POST" in (r.methods or ())
    ]
    for route in DIRECT_ROUTES:
        endpoints = [r.endpoint for r in declared if r.path == route.path]
        assert endpoints == [route.endpoint]
        operation = schema["paths"][route.path]["post"]
        body_ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert body_ref.endswith("/" + route.body.__name__)
        scopes = {s for entry in operation["security"] for given in entry.values() for s in given}
        assert scopes == {route.scope}
        assert any("x-api-key" in entry for entry in operation["security"]) == route.api_key
