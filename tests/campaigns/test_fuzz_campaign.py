"""The fuzz campaign: schemathesis over ``/openapi.json`` against a real server with a
valid token (plus generated ``Idempotency-Key`` and ``Last-Event-ID`` headers), and
hypothesis properties of every parser — durations, cursors and ``Last-Event-ID``,
idempotency keys and digests, Unicode (lone surrogates included), GGUF headers, the
CLI's escaping, user codes — then raw request heads (any number and size of fields,
any ``Host``, long request lines; both HTTP parsers), tool definitions and
``tool_choice`` of any JSON shape in both APIs, and hostile inputs through the real
server: generated JSON Schemas (and schema bombs) in ``text.format``, tool parameters
and Chat ``response_format``, and generated PDFs (damaged, truncated, bit-flipped,
inflating, deeply nested) as input files. No input may give a 5xx or a hang (each call
has a deadline); every error has the section-8 shape and shows no library internals.

``make test`` runs a short pass; ``make torture`` (``LMSP_CAMPAIGN=long``) runs at least
2,000 schemathesis cases, 2,000 cases per parser (and per head and tool campaign) and
400 schemas and 400 PDFs.
"""

from __future__ import annotations

import contextlib
import json
import re
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lmsp import config, errors
from lmsp.api import inputs
from lmsp.bootstrap import bundled_model_path
from lmsp.cli.safe import clean, clean_json
from lmsp.gguf import NotGGUF, check_structure, read_header_from
from lmsp.store import idempotency, pairing
from tests import hostile
from tests.campaigns.invariants import Ledger, check, long_run, report
from tests.helpers import Server, raw_request, rss_mib, seeded_data_dir, status_of, tiny_pdf

PER_PARSER = 2000 if long_run() else 150
PER_OPERATION = 150 if long_run() else 12
PER_INPUT_KIND = 400 if long_run() else 12  # schemas, PDFs: each a request to the server
COUNTS: dict[str, int] = {}

# every code point, lone surrogates included (hypothesis leaves them out by default)
ANY_CHAR = st.characters(exclude_categories=())
ANY_TEXT = st.text(ANY_CHAR, max_size=40)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module", autouse=True)
def parser_figures() -> Iterator[None]:
    """The parser properties' figures, once this module's tests ran (a failing property
    fails its own test; these are the cases that passed)."""
    yield
    if COUNTS:
        report(
            f"fuzz campaign (parsers): {sum(COUNTS.values())} cases —"
            f" {', '.join(f'{k} {v}' for k, v in COUNTS.items())}"
        )


def counted(name: str) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + 1


def parser_settings() -> Any:
    return settings(max_examples=PER_PARSER, deadline=None, database=None)


# -- parsers -----------------------------------------------------------------------------------


@parser_settings()
@given(ANY_TEXT)
def test_durations(text: str) -> None:
    counted("durations")
    try:
        value = config.parse_duration(text)
    except ValueError:
        return
    assert value >= 0


@parser_settings()
@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["", "ms", "s", "m", "h", "d"]))
def test_durations_that_are_valid(number: int, unit: str) -> None:
    counted("durations")
    scale = {"": 1, "ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    assert config.parse_duration(f"{number}{unit}") == pytest.approx(number * scale)


@parser_settings()
@given(st.one_of(ANY_TEXT, st.integers(min_value=-(2**70), max_value=2**70).map(str)))
def test_last_event_id(text: str) -> None:
    counted("Last-Event-ID")
    try:
        value = inputs.event_id(text)
    except errors.LmspError as exc:
        assert exc.code == "invalid_value" and exc.param == "Last-Event-ID"
        return
    if value is not None:
        assert -1 <= value <= inputs.MAX_SEQUENCE
        assert re.fullmatch(r"\s*-?[0-9]+\s*", text)


@parser_settings()
@given(st.integers(min_value=-5, max_value=2**64), ANY_TEXT)
def test_resume_points(after: int, header: str) -> None:
    counted("cursors")
    try:
        point = inputs.resume_after(after, header)
    except errors.LmspError:
        return
    assert point >= after


@parser_settings()
@given(JSON, st.sampled_from(["POST", "post"]), ANY_TEXT)
def test_idempotency_digests(body: Any, method: str, path: str) -> None:
    counted("idempotency digests")
    digest = idempotency.request_digest(method, path, body)
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    if isinstance(body, dict):
        reordered = dict(reversed(list(body.items())))
        assert idempotency.request_digest("POST", path, reordered) == digest


@parser_settings()
@given(ANY_TEXT)
def test_idempotency_keys(key: str) -> None:
    counted("idempotency keys")
    assert idempotency.valid_key(key) == bool(re.fullmatch(r"[!-~]{1,255}", key))


@parser_settings()
@given(JSON)
def test_lone_surrogates(value: Any) -> None:
    counted("unicode")
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        storable = True
    except UnicodeEncodeError:
        storable = False
    where = inputs.lone_surrogate(value)
    assert (where is None) == storable
    if where is not None:
        where.encode("utf-8")  # the path itself can be sent back


@parser_settings()
@given(st.binary(max_size=256))
def test_gguf_reader_on_any_bytes(data: bytes) -> None:
    import io

    counted("gguf")
    for parse in (lambda f: read_header_from(f), lambda f: check_structure(f, len(data))):
        with contextlib.suppress(NotGGUF):
            parse(io.BytesIO(data))


HEAD = bundled_model_path().open("rb").read(4096)


@parser_settings()
@given(st.integers(min_value=0, max_value=4095), st.integers(min_value=0, max_value=255))
def test_gguf_reader_on_damaged_headers(at: int, byte: int) -> None:
    import io

    counted("gguf")
    data = bytearray(HEAD)
    data[at] = byte
    with contextlib.suppress(NotGGUF):
        check_structure(io.BytesIO(bytes(data)), len(data))


@parser_settings()
@given(ANY_TEXT, st.booleans())
def test_cli_escaping(text: str, multiline: bool) -> None:
    counted("cli escaping")
    shown = clean(text, multiline=multiline)
    for ch in shown:
        code = ord(ch)
        assert code >= 0x20 or (multiline and ch in "\n\t")
        assert not (0x7F <= code < 0xA0) and not 0xD800 <= code < 0xE000
    if all(32 <= ord(c) < 127 for c in text):
        assert shown == text
    assert json.loads(clean_json({"v": text})) == {"v": text}


@parser_settings()
@given(ANY_TEXT)
def test_user_codes(text: str) -> None:
    counted("user codes")
    pairing.normalize_code(text)


@settings(
    max_examples=max(50, PER_PARSER // 10),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    after=st.integers(min_value=-(2**65), max_value=2**65),
    header=st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=25),
)
def test_cursors_through_the_api(client: TestClient, after: int, header: str) -> None:
    counted("cursors")
    obj = _finished(client)
    for url in (
        f"/v1/tasks/{obj['task']['id']}/events?after={after}",
        f"/v1/responses/{obj['id']}?stream=true&starting_after={after}",
    ):
        answer = client.get(url, headers={"Last-Event-ID": header, "Accept": "application/json"})
        assert answer.status_code < 500, answer.text
        if answer.status_code >= 400:
            assert set(answer.json()["error"]) == {"type", "code", "message", "param"}


_FINISHED: dict[int, dict[str, Any]] = {}


def _finished(client: TestClient) -> dict[str, Any]:
    key = id(client)
    if key not in _FINISHED:
        _FINISHED.clear()
        answer = client.post("/v1/responses", json={"model": "lmsp-test", "input": "fuzz"})
        _FINISHED[key] = answer.json()
    return _FINISHED[key]


# -- the API against a real server ---------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("fuzz-campaign") / "data",
        env={
            "LMSP_TEST_ENGINE_DELAY": "0",
            "LMSP_MAX_PENDING_PAIRINGS_PER_SOURCE": "100000",
            "LMSP_SCHEMA_CPU_TIME": "1s",
            "LMSP_FILE_CPU_TIME": "1s",
        },
    )
    srv.start()
    yield srv
    srv.stop()


HEADER_TEXT = st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=300)


@pytest.mark.slow
def test_schema_fuzz_campaign(fuzz_server: Server) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    auth = {"Authorization": f"Bearer {fuzz_server.token}"}
    statuses: dict[int, int] = {}
    violations: list[str] = []
    operations = 0
    started = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @given(case=operation.as_strategy(), key=st.none() | HEADER_TEXT, last=HEADER_TEXT)
        @settings(
            max_examples=PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def call(case: Any, key: str | None, last: str) -> None:
            headers = dict(auth)
            if key is not None and case.method == "POST":
                headers["Idempotency-Key"] = key
            if case.method == "GET" and (case.headers or {}).get("last-event-id") is None:
                headers["Last-Event-ID"] = last
            response = case.call(base_url=fuzz_server.url, headers=headers, timeout=30)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            where = f"{case.method} {case.formatted_path}"
            if response.status_code >= 500:
                violations.append(f"{where}: {response.status_code} {response.text[:200]}")
            elif response.status_code >= 400:
                error = response.json().get("error", {})
                shape = {"type", "code", "message", "param"}
                if case.path.startswith("/v1/messages"):  # Anthropic's envelope there
                    shape = {"type", "message"} if response.json().get("type") == "error" else shape
                if set(error) != shape:
                    violations.append(f"{where}: error shape {response.text[:200]}")
                if "Traceback" in response.text:
                    violations.append(f"{where}: a traceback in the answer")

        call()
    cases = sum(statuses.values())
    violations += check(fuzz_server.data_dir, Ledger())
    report(
        f"fuzz campaign: {cases} schemathesis cases over {operations} operations in"
        f" {time.monotonic() - started:.0f}s (statuses {dict(sorted(statuses.items()))});"
        f" {len(violations)} violations"
    )
    assert not violations, violations[:10]
    assert operations >= 15
    assert cases >= (2000 if long_run() else 100)


# -- request heads, raw, against both HTTP parsers ----------------------------------------------
PER_HEAD = 2000 if long_run() else 60
TOKEN = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz-_0123456789"), min_size=1, max_size=20)
FIELD_VALUE = st.one_of(
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80),
    st.integers(min_value=0, max_value=200_000).map(lambda n: "v" * n),
).map(lambda text: text.encode("latin-1"))
HOSTS = st.one_of(
    st.none(),
    st.sampled_from(["127.0.0.1", "localhost", "[::1]", "evil.example", "127.0.0.1.nip.io", ""]),
    st.builds(lambda p: f"127.0.0.1:{p}", st.integers(min_value=0, max_value=70_000)),
    st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=60),
)
HEAD_OK = {200, 400, 401, 404, 405, 408, 421, 431}


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    target = draw(st.sampled_from(["/healthz", "/v1/service", "/metrics", "/", "/v1/models"]))
    target += (
        "?" + "q" * draw(st.integers(min_value=0, max_value=100_000)) if draw(st.booleans()) else ""
    )
    lines = [f"GET {target} HTTP/1.1".encode()]
    host = draw(HOSTS)
    if host is not None:
        lines.append(b"Host: " + host.encode("latin-1"))
    many = draw(st.one_of(st.integers(0, 20), st.integers(90, 110), st.integers(1000, 20_000)))
    name, value = draw(TOKEN), draw(FIELD_VALUE)
    if many > 200:  # thousands of one small field: drawing each would be slow
        lines += [b"X-" + name.encode() + b"%d: a" % i for i in range(many)]
    else:
        lines += [
            draw(TOKEN).encode() + b": " + (value if i == 0 else draw(FIELD_VALUE)[:40])
            for i in range(many)
        ]
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


@pytest.fixture(scope="module", params=["httptools", "h11"])
def head_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp(f"fuzz-heads-{request.param}") / "data",
        env={"LMSP_HTTP": request.param},
    ).start()
    yield srv
    srv.stop()


@pytest.mark.slow
def test_head_fuzz_campaign(head_server: Server) -> None:
    assert head_server.proc is not None
    pid = head_server.proc.pid
    statuses: dict[int, int] = {}
    violations: list[str] = []
    before = rss_mib(pid)

    @given(head=heads())
    @example(head=b"GET /metrics HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
    @example(head=b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    @example(head=b"GET /healthz HTTP/1.1\r\nX-A: " + b"a" * 70_000 + b"\r\n\r\n")
    @settings(
        max_examples=PER_HEAD, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def call(head: bytes) -> None:
        answer = raw_request(head_server.port, head)
        status = status_of(answer)
        statuses[status] = statuses.get(status, 0) + 1
        if status not in HEAD_OK:
            violations.append(f"{status} for a {len(head)}-byte head: {answer[:200]!r}")
        elif status >= 400 and status != 400:  # a parser's own 400 is plain text
            body = answer.split(b"\r\n\r\n", 1)[1]
            if set(json.loads(body)["error"]) != {"type", "code", "message", "param"}:
                violations.append(f"error shape: {body[:200]!r}")

    call()
    grown = rss_mib(pid) - before
    report(
        f"fuzz campaign (heads, {head_server.extra_env['LMSP_HTTP']}): {sum(statuses.values())}"
        f" heads (statuses {dict(sorted(statuses.items()))}); RSS grew {grown:.0f} MiB;"
        f" {len(violations)} violations"
    )
    assert not violations, violations[:10]
    assert grown < 64, f"RSS grew by {grown:.0f} MiB"
    assert 431 in statuses and 421 in statuses and 200 in statuses


# -- tool definitions and tool_choice of any shape, both APIs ------------------------------------
PER_TOOLS = 2000 if long_run() else 80
TOOL_MODEL = "smollm2-135m-instruct"  # a tool choice is a grammar: the real engine follows it


def near_tool(chat: bool) -> Any:
    """A tool that is often nearly right: the shapes the APIs expect, with any JSON in
    each place."""
    name = st.one_of(st.sampled_from(["f", "g", "get_weather", "<tool_call>", "a b"]), JSON)
    function = st.fixed_dictionaries(
        {"name": name},
        optional={"parameters": st.one_of(st.just({"type": "object"}), JSON), "strict": JSON},
    )
    if chat:
        shaped = st.fixed_dictionaries({"type": st.just("function"), "function": function})
    else:
        shaped = function.map(lambda f: {"type": "function", **f})
    return st.one_of(shaped, JSON)


def near_choice(chat: bool) -> Any:
    named = (
        st.builds(lambda n: {"type": "function", "function": {"name": n}}, JSON | st.just("f"))
        if chat
        else st.builds(lambda n: {"type": "function", "name": n}, JSON | st.just("f"))
    )
    listed = st.lists(st.one_of(named, JSON), max_size=3)
    allowed = (
        st.builds(
            lambda m, t: {"type": "allowed_tools", "allowed_tools": {"mode": m, "tools": t}},
            JSON | st.just("auto"),
            listed,
        )
        if chat
        else st.builds(
            lambda m, t: {"type": "allowed_tools", "mode": m, "tools": t},
            JSON | st.just("auto"),
            listed,
        )
    )
    return st.one_of(st.sampled_from(["none", "auto", "required"]), named, allowed, JSON)


@st.composite
def tool_requests(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    chat = draw(st.booleans())
    body: dict[str, Any] = {"tools": draw(st.lists(near_tool(chat), max_size=3) | JSON)}
    if draw(st.booleans()):
        body["tool_choice"] = draw(near_choice(chat))
    if chat:
        messages = [{"role": "user", "content": "hi"}]
        return "/v1/chat/completions", {
            "model": TOOL_MODEL,
            "messages": messages,
            "max_tokens": 1,
            **body,
        }
    return "/v1/responses", {"model": TOOL_MODEL, "input": "hi", "max_output_tokens": 1, **body}


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory: pytest.TempPathFactory, blob_cache: Path) -> Iterator[Server]:
    data_dir = seeded_data_dir(tmp_path_factory.mktemp("fuzz-tools") / "data", blob_cache)
    srv = Server(data_dir).start()
    yield srv
    srv.stop()


@pytest.mark.slow
def test_tool_shape_fuzz_campaign(tool_server: Server) -> None:
    import httpx

    statuses: dict[int, int] = {}
    violations: list[str] = []
    with tool_server.client() as http:

        @given(request=tool_requests())
        @settings(
            max_examples=PER_TOOLS,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def call(request: tuple[str, dict[str, Any]]) -> None:
            path, body = request
            try:
                answer = http.post(path, content=json.dumps(body, allow_nan=False))
            except (ValueError, httpx.HTTPError) as exc:  # e.g. a lone surrogate: not JSON
                statuses[0] = statuses.get(0, 0) + 1
                assert isinstance(exc, ValueError), exc
                return
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
            if answer.status_code >= 500:
                violations.append(f"{path} {body}: {answer.status_code} {answer.text[:200]}")
            elif answer.status_code >= 400:
                error = answer.json()["error"]
                if set(error) != {"type", "code", "message", "param"}:
                    violations.append(f"{path}: error shape {answer.text[:200]}")
                elif answer.status_code == 400 and not (error["param"] or "").startswith(
                    ("tools", "tool_choice", "messages", "input")
                ):
                    violations.append(f"{path} {body}: param {error['param']!r}")

        call()
    violations += check(tool_server.data_dir, Ledger())
    report(
        f"fuzz campaign (tool shapes): {sum(statuses.values())} requests"
        f" (statuses {dict(sorted(statuses.items()))}); {len(violations)} violations"
    )
    assert not violations, violations[:10]
    assert 400 in statuses


def test_gguf_header_sample_is_whole() -> None:
    """The damaged-header cases start from a real header (not from noise)."""
    assert HEAD[:4] == b"GGUF" and struct.unpack("<I", HEAD[4:8])[0] in (2, 3)


# -- hostile inputs through the real server -----------------------------------------------------

INTERNALS = ("panic", "backtrace", ".rs:", "Traceback", "site-packages")
KEY = st.text(st.characters(min_codepoint=48, max_codepoint=122), min_size=1, max_size=8)
SCHEMA_LEAF = st.sampled_from(
    [
        {},
        {"type": "string"},
        {"type": "string", "maxLength": 5},
        {"type": "string", "pattern": "^[a-z]{1,3}$"},
        {"type": "string", "format": "date"},
        {"type": "string", "format": "no-such-format"},
        {"type": "integer", "minimum": -5, "maximum": 5},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
        {"enum": ["a", 1, None]},
        {"const": "x"},
        {"type": "array", "uniqueItems": True},
        {"not": {"type": "string"}},
        {"$ref": "#/$defs/missing"},
        {"type": "string", "pattern": "(a|"},
    ]
)
SCHEMAS = st.recursive(
    SCHEMA_LEAF,
    lambda inner: st.one_of(
        st.builds(
            lambda props, required: {
                "type": "object",
                "properties": props,
                "required": [k for k in props if required],
            },
            st.dictionaries(KEY, inner, max_size=5),
            st.booleans(),
        ),
        st.builds(lambda item: {"type": "array", "items": item, "maxItems": 3}, inner),
        st.builds(lambda alts: {"anyOf": alts}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda alts: {"allOf": alts}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=25,
)
BOMBS = st.one_of(
    st.integers(min_value=2_000, max_value=20_000).map(hostile.schema_bomb),
    st.integers(min_value=50, max_value=400).map(lambda depth: _nested_schema(depth)),
)


def _nested_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _no_5xx(answer: Any, where: str, statuses: dict[int, int], violations: list[str]) -> None:
    statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
    if answer.status_code >= 500:
        violations.append(f"{where}: {answer.status_code} {answer.text[:200]}")
    elif answer.status_code >= 400:
        error = answer.json().get("error", {})
        if set(error) != {"type", "code", "message", "param"}:
            violations.append(f"{where}: error shape {answer.text[:200]}")
    for marker in INTERNALS:
        if marker in answer.text:
            violations.append(f"{where}: {marker!r} in the answer {answer.text[:200]}")


@pytest.mark.slow
def test_hostile_schemas_fuzz_campaign(fuzz_server: Server) -> None:
    statuses: dict[int, int] = {}
    violations: list[str] = []
    started = time.monotonic()

    @given(schema=st.one_of(SCHEMAS, SCHEMAS, SCHEMAS, BOMBS), where=st.sampled_from(range(3)))
    @settings(
        max_examples=PER_INPUT_KIND,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call(schema: dict[str, Any], where: int) -> None:
        body: dict[str, Any] = {"model": "lmsp-test", "max_output_tokens": 8}
        path = "/v1/responses"
        if where == 0:
            body |= {
                "input": "x",
                "text": {"format": {"type": "json_schema", "name": "f", "schema": schema}},
            }
        elif where == 1:
            body |= {
                "input": "x",
                "tools": [{"type": "function", "name": "f", "parameters": schema}],
            }
        else:
            path = "/v1/chat/completions"
            body |= {
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "f", "schema": schema},
                },
            }
        with fuzz_server.client(timeout=120) as http:
            answer = http.post(path, json=body)
        _no_5xx(answer, f"POST {path} schema", statuses, violations)

    call()
    report(
        f"fuzz campaign (schemas): {sum(statuses.values())} requests in"
        f" {time.monotonic() - started:.0f}s (statuses {dict(sorted(statuses.items()))});"
        f" {len(violations)} violations"
    )
    assert not violations, violations[:10]


VALID_PDF = tiny_pdf("A perfectly ordinary page of text.")


def _mutated(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    out = bytearray(data)
    for at, byte in edits:
        out[at % len(out)] = byte
    return bytes(out[:cut] if cut else out)


PDFS = st.one_of(
    st.builds(
        _mutated,
        st.just(VALID_PDF),
        st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=8),
        st.none() | st.integers(min_value=1, max_value=len(VALID_PDF)),
    ),
    st.binary(max_size=2_000).map(lambda noise: b"%PDF-1.4\n" + noise),
    st.integers(min_value=10_000, max_value=4_000_000).map(hostile.text_bomb),
    st.integers(min_value=1_000, max_value=200_000).map(hostile.tj_bomb),
    st.integers(min_value=100, max_value=60_000).map(hostile.nested_bomb),
    st.integers(min_value=1, max_value=3_000).map(hostile.warning_bomb),
    st.just(hostile.inflation_bomb()),
)


@pytest.mark.slow
def test_hostile_pdfs_fuzz_campaign(fuzz_server: Server) -> None:
    statuses: dict[int, int] = {}
    violations: list[str] = []
    started = time.monotonic()

    @given(pdf=PDFS)
    @settings(
        max_examples=PER_INPUT_KIND,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call(pdf: bytes) -> None:
        body = {"model": "lmsp-test", "input": hostile.pdf_input(pdf), "max_output_tokens": 4}
        with fuzz_server.client(timeout=120) as http:
            answer = http.post("/v1/responses", json=body)
        _no_5xx(answer, "POST /v1/responses pdf", statuses, violations)

    call()
    report(
        f"fuzz campaign (PDFs): {sum(statuses.values())} requests in"
        f" {time.monotonic() - started:.0f}s (statuses {dict(sorted(statuses.items()))});"
        f" {len(violations)} violations"
    )
    assert not violations, violations[:10]
