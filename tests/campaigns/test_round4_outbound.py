"""Round 4's outbound campaign (issue 36, items 2, 5 and 11b): where lmsp calls out, with
hostile inputs against real servers and real receivers on loopback.

- **Host forms.** Generated IPv4 addresses (link-local, loopback, any) written in every
  form the resolver takes — one to four parts, each decimal, hex or octal, any case, a
  trailing dot — bare or carried in IPv6 (mapped, compatible, NAT64, 6to4, Teredo), and
  link-local IPv6: as webhook URLs and MCP server URLs on a server with
  ``LMSP_WEBHOOK_HOSTS=*`` and ``LMSP_MCP_HOSTS=*`` (a violation: a link-local address
  accepted in any form), and as webhook URLs on a server with no list (a violation:
  anything accepted that is not loopback). Loopback forms accepted there are delivered
  to a real receiver (a violation: one not delivered).
- **Dead receivers.** One client's 32 webhooks point at a receiver that accepts every
  connection and never answers, while it keeps ending responses; another client's
  webhook must be delivered within the issue's 2 s (a violation past 5 s, the
  generous bound; the figures are printed).
- **Port probes.** A client that is not ``admin`` tests webhooks on a closed port, a
  refusing receiver, a dead one and a port that is not HTTP: a violation if the
  answers differ, or one comes sooner than the others' 5 s.

No answer may be a 5xx or lack the section-8 shape. ``make test`` runs a short pass;
``make torture`` (``LMSP_CAMPAIGN=long``) 2,000 host forms, 60 deliveries beside the dead
receivers and 6 probe rounds.
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lmsp.outbound import deliverer as sender
from tests.campaigns.invariants import long_run, report
from tests.helpers import Server, free_port
from tests.webhook_receiver import Babbler, Dead, Receiver

pytestmark = pytest.mark.slow

HOST_FORMS = 2000 if long_run() else 60
BYSTANDER_DELIVERIES = 60 if long_run() else 4
PROBE_ROUNDS = 6 if long_run() else 1
BOUND = 2.0  # the issue's
ASSERTED = 5.0  # a violation past this (a shared machine)
EVENTS = ["response.completed"]


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"LMSP_WEBHOOK_HOSTS": "*", "LMSP_MCP_HOSTS": "*"}
    srv = Server(tmp_path_factory.mktemp("outbound-wide") / "data", env=env).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("outbound-narrow") / "data").start()
    yield srv
    srv.stop()


def shaped(answer: httpx.Response, where: str, bad: list[str]) -> None:
    if answer.status_code >= 500:
        bad.append(f"{where}: {answer.status_code} {answer.text[:200]}")
    elif answer.status_code >= 400:
        error = answer.json().get("error", {})
        if set(error) != {"type", "code", "message", "param"}:
            bad.append(f"{where}: error shape {answer.text[:200]}")


def new_client(server: Server, name: str) -> httpx.Client:
    with server.client() as owner:
        made = owner.post(
            "/v1/clients", json={"name": name, "scopes": ["responses:read", "responses:write"]}
        )
    token = made.json()["token"]
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=120
    )


# -- host forms --------------------------------------------------------------------------------
def _part(value: int, base: str, upper: bool) -> str:
    if base == "hex":
        text = f"0x{value:x}"
        return text.upper() if upper else text
    if base == "oct":
        return f"0{value:o}"
    return str(value)


@st.composite
def v4_forms(draw: st.DrawFn, number: int) -> str:
    """``number`` in one of inet_aton's forms."""
    parts = draw(st.integers(min_value=1, max_value=4))
    octets = number.to_bytes(4, "big")
    head = list(octets[: parts - 1])
    last = int.from_bytes(octets[parts - 1 :], "big")
    bases = draw(st.lists(st.sampled_from(["dec", "hex", "oct"]), min_size=parts, max_size=parts))
    upper = draw(st.booleans())
    text = ".".join(_part(v, b, upper) for v, b in zip([*head, last], bases, strict=True))
    return text + ("." if draw(st.booleans()) else "")


ADDRESSES = st.one_of(
    st.integers(min_value=0xA9FE0000, max_value=0xA9FEFFFF),  # 169.254.0.0/16
    st.just(0xA9FEA9FE),  # the metadata service's
    st.integers(min_value=0x7F000000, max_value=0x7FFFFFFF),  # 127.0.0.0/8
    st.just(0x7F000001),  # where the receiver listens
    st.integers(min_value=0, max_value=2**32 - 1),
)


@st.composite
def hosts(draw: st.DrawFn) -> tuple[str, int | None, str]:
    """``(host as written, the IPv4 address it carries or None, how it is carried)``."""
    wrap = draw(
        st.sampled_from(["bare", "mapped", "mapped-hex", "compatible", "nat64", "6to4", "teredo"])
        | st.just("fe80")
    )
    if wrap == "fe80":
        tail = draw(st.integers(min_value=0, max_value=2**64 - 1))
        return f"[{ipaddress.IPv6Address((0xFE80 << 112) | tail)}]", None, wrap
    number = draw(ADDRESSES)
    dotted = str(ipaddress.IPv4Address(number))
    hi, lo = number >> 16, number & 0xFFFF
    written = {
        "bare": draw(v4_forms(number)),
        "mapped": f"[::ffff:{dotted}]",
        "mapped-hex": f"[::ffff:{hi:x}:{lo:x}]",
        "compatible": f"[::{dotted}]",
        "nat64": f"[64:ff9b::{dotted}]",
        "6to4": f"[2002:{hi:x}:{lo:x}::1]",
        "teredo": f"[2001:0:4136:e378:8000:63bf:{hi ^ 0xFFFF:x}:{lo ^ 0xFFFF:x}]",
    }[wrap]
    return written, number, wrap


def link_local(number: int | None, wrap: str) -> bool:
    return wrap == "fe80" or (number is not None and number >> 16 == 0xA9FE)


def reaches_loopback(number: int | None, wrap: str) -> bool:
    if number is None:
        return False
    if wrap == "compatible":
        return number == 1  # ::0.0.0.1 is ::1
    return wrap in ("bare", "mapped", "mapped-hex") and number >> 24 == 127


def deliverable(host: str, number: int | None, wrap: str) -> bool:
    """Whether a loopback form reaches the receiver: 127.0.0.1 (where it listens), and no
    trailing dot (the resolver takes ``127.0.0.1.`` for a name, which resolves nowhere
    here; the rule reads it as the address, and the connection must reach loopback)."""
    return number == 0x7F000001 and wrap != "compatible" and not host.endswith(".")


def test_host_forms(wide: Server, narrow: Server) -> None:
    bad: list[str] = []
    counts = {"forms": 0, "link-local": 0, "refused": 0, "loopback accepted": 0}
    ear = Receiver().start()
    kept: list[str] = []  # loopback forms accepted without a list: each must be delivered
    try:
        with wide.client() as open_, narrow.client() as closed:

            @given(found=hosts())
            @example(found=("2130706433", 0x7F000001, "bare"))
            @example(found=("0x7f.1", 0x7F000001, "bare"))
            @example(found=("0177.0.1", 0x7F000001, "bare"))
            @example(found=("[::ffff:7f00:1]", 0x7F000001, "mapped-hex"))
            @example(found=("2852039166", 0xA9FEA9FE, "bare"))
            @example(found=("0xa9.0xfe.0xa9.0xfe", 0xA9FEA9FE, "bare"))
            @settings(
                max_examples=HOST_FORMS,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def case(found: tuple[str, int | None, str]) -> None:
                host, number, wrap = found
                counts["forms"] += 1
                near = link_local(number, wrap)
                counts["link-local"] += near
                body = {"url": f"http://{host}/latest/meta-data/", "events": EVENTS}
                made = open_.post("/v1/webhooks", json=body)
                shaped(made, f"webhook {host}", bad)
                if made.status_code == 201:
                    open_.delete(f"/v1/webhooks/{made.json()['id']}")
                    if near:
                        bad.append(f"LMSP_WEBHOOK_HOSTS=*: {host} (link-local) accepted")
                tool = {
                    "type": "mcp",
                    "server_label": "s",
                    "server_url": f"http://{host}/mcp",
                    "require_approval": "never",
                }
                mcp = open_.post(
                    "/v1/responses",
                    json={"model": "lmsp-test", "input": "x", "tools": [tool], "background": True},
                )
                shaped(mcp, f"mcp {host}", bad)
                code = mcp.json().get("error", {}).get("code") if mcp.status_code == 400 else None
                if near and code != "invalid_mcp_server":
                    bad.append(f"LMSP_MCP_HOSTS=*: {host} (link-local) answered {mcp.status_code}")
                url = f"http://{host}:{ear.port}/hook?{len(kept)}"
                mine = closed.post("/v1/webhooks", json={"url": url, "events": EVENTS})
                shaped(mine, f"webhook (no list) {host}", bad)
                if mine.status_code != 201:
                    counts["refused"] += 1
                    return
                if not reaches_loopback(number, wrap):
                    bad.append(f"no LMSP_WEBHOOK_HOSTS: {host} accepted (not loopback)")
                counts["loopback accepted"] += 1
                if len(kept) < 16 and deliverable(host, number, wrap):
                    kept.append(mine.json()["id"])
                else:
                    closed.delete(f"/v1/webhooks/{mine.json()['id']}")

            case()
            if kept:
                made = closed.post("/v1/responses", json={"model": "lmsp-test", "input": "hi"})
                deadline = time.monotonic() + 120
                while len(ear.accepted()) < len(kept) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if len(ear.accepted()) != len(kept):
                    bad.append(f"{len(kept)} loopback forms, {len(ear.accepted())} delivered")
                heard = {json.loads(d.body)["data"]["id"] for d in ear.accepted()}
                if heard - {made.json()["id"]}:
                    bad.append(f"deliveries of another response: {heard}")
    finally:
        ear.stop()
    report(
        f"outbound campaign, host forms: {counts['forms']} forms ({counts['link-local']}"
        f" link-local) against LMSP_*_HOSTS=* and no list; {counts['loopback accepted']}"
        f" loopback forms accepted, {len(kept)} of them sent a delivery and heard it on a real"
        f" receiver;"
        f" {counts['refused']} refused without a list; {len(bad)} violations"
    )
    assert not bad, bad[:10]


# -- dead receivers ----------------------------------------------------------------------------
def test_dead_receivers(narrow: Server) -> None:
    bad: list[str] = []
    dead, ear = Dead().start(), Receiver().start()
    stop = threading.Event()
    ended = [0]
    waited: list[float] = []
    try:
        with new_client(narrow, "hostile") as hostile, new_client(narrow, "bystander") as good:
            hooks = [
                hostile.post(
                    "/v1/webhooks", json={"url": f"{dead.url}?{n}", "events": EVENTS}
                ).json()["id"]
                for n in range(32)
            ]

            def keep_ending() -> None:  # 32 more deliveries to the dead receiver each time
                while not stop.is_set():
                    answer = hostile.post(
                        "/v1/responses", json={"model": "lmsp-test", "input": "x"}
                    )
                    shaped(answer, "hostile response", bad)
                    ended[0] += 1
                    stop.wait(0.5)

            worker = threading.Thread(target=keep_ending, daemon=True)
            worker.start()
            deadline = time.monotonic() + 120
            while dead.accepted < sender.PER_CLIENT and time.monotonic() < deadline:
                time.sleep(0.02)
            mine = good.post("/v1/webhooks", json={"url": ear.url, "events": EVENTS}).json()
            for n in range(BYSTANDER_DELIVERIES):
                made = good.post("/v1/responses", json={"model": "lmsp-test", "input": f"{n}"})
                shaped(made, "bystander response", bad)
                response_id = made.json()["id"]
                deadline = time.monotonic() + 120
                found = None
                while found is None and time.monotonic() < deadline:
                    got = [d for d in ear.received() if response_id.encode() in d.body]
                    found = got[0] if got else None
                    time.sleep(0.01)
                if found is None:
                    bad.append(f"the bystander's delivery {n} never came")
                    continue
                rows = good.get(f"/v1/webhooks/{mine['id']}/deliveries").json()["data"]
                row = next(r for r in rows if r["response_id"] == response_id)
                waited.append(found.at - row["created_at"])
                if waited[-1] > ASSERTED:
                    bad.append(f"the bystander's delivery {n} waited {waited[-1]:.1f} s")
                time.sleep(0.2)
            stop.set()
            worker.join(60)
            for hook in hooks:  # the backlog goes with them
                hostile.delete(f"/v1/webhooks/{hook}")
    finally:
        stop.set()
        dead.stop()
        ear.stop()
    ordered = sorted(waited) or [float("nan")]
    report(
        f"outbound campaign, dead receivers: one client's 32 webhooks to a receiver that never"
        f" answers ({ended[0]} responses ended, {dead.accepted} connections held); another"
        f" client's {len(waited)} deliveries: median {ordered[len(ordered) // 2]:.3f} s,"
        f" max {ordered[-1]:.3f} s (bound {BOUND} s); {len(bad)} violations"
    )
    assert not bad, bad[:10]


# -- port probes -------------------------------------------------------------------------------
def probed_together(
    prober: httpx.Client, ids: dict[str, str], bad: list[str]
) -> dict[str, tuple[int, str, float]]:
    """Test every webhook of ``ids`` at once: kind → (status, body, seconds taken)."""
    answers: dict[str, tuple[int, str, float]] = {}

    def probe(kind: str) -> None:
        began = time.monotonic()
        got = prober.post(
            f"/v1/webhook_endpoints/{ids[kind]}/test", json={"event_type": "response.completed"}
        )
        shaped(got, f"test {kind}", bad)
        answers[kind] = (got.status_code, got.text, time.monotonic() - began)

    threads = [threading.Thread(target=probe, args=(kind,)) for kind in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return answers


def test_port_probes(narrow: Server) -> None:
    bad: list[str] = []
    answers_seen = 0
    for round_ in range(PROBE_ROUNDS):
        refusing, dead, babbler = Receiver(refuse=10**6).start(), Dead().start(), Babbler()
        targets = {
            "closed": f"http://127.0.0.1:{free_port()}/hook",
            "refusing": refusing.url,
            "dead": dead.url,
            "not http": f"http://127.0.0.1:{babbler.port}/hook",
        }
        try:
            with new_client(narrow, f"prober{round_}") as prober:
                ids = {
                    kind: prober.post(
                        "/v1/webhook_endpoints",
                        json={"name": kind, "url": url, "event_types": EVENTS},
                    ).json()["id"]
                    for kind, url in targets.items()
                }
                answers = probed_together(prober, ids, bad)
                answers_seen += len(answers)
                if len({(status, text) for status, text, _ in answers.values()}) != 1:
                    bad.append(f"round {round_}: the answers differ: {answers}")
                early = {k: t for k, (_, _, t) in answers.items() if t < sender.TEST_TIMEOUT}
                if early:
                    bad.append(f"round {round_}: answered before {sender.TEST_TIMEOUT} s: {early}")
        finally:
            refusing.stop()
            dead.stop()
            babbler.stop()
    report(
        f"outbound campaign, port probes: {PROBE_ROUNDS} rounds, {answers_seen} webhook tests"
        f" on closed, refusing, dead and non-HTTP ports by a client that is not admin, all"
        f" alike; {len(bad)} violations"
    )
    assert not bad, bad[:10]
