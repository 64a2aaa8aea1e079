"""The connection guard of webhooks and MCP (``lmsp.outbound.guard``) with real
receivers on loopback: the resolver is the only thing stood in for (a test cannot steer
the system's DNS), so a name can answer what an attacker's DNS would — a link-local
address, another address on a second look (rebinding), a ``.localhost`` name pointing
elsewhere. Every connection goes only to an admitted address, for httpx (webhooks) and
httpx2 (the MCP SDK's client) alike; no proxy from the environment is used."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import pytest

from lmsp.outbound import guard as outbound
from lmsp.protocol.outbound import HostRule, parse_hosts
from tests.helpers import free_port
from tests.webhook_receiver import Receiver

STAR = parse_hosts("*", "X")
NONE: tuple[HostRule, ...] = ()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    ear = Receiver().start()
    yield ear
    ear.stop()


class Dns:
    """A resolver that answers from a table (a list of answers per name: one per look,
    the last one repeated), and notes every look."""

    def __init__(self, table: dict[str, list[list[str]]]) -> None:
        self.table = table
        self.looks: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.looks.append(host)
        answers = self.table.get(host)
        if answers is None:
            return await outbound.resolve(host, port)
        return answers[min(len(answers), self.looks.count(host)) - 1]


async def post(rules: tuple[HostRule, ...], dns: Dns, url: str, flavour: str = "httpx") -> Any:
    """One request on a fresh client (a fresh connection): its status, or the error."""
    if flavour == "httpx":
        async with outbound.client(rules, httpx.Timeout(5), {}, resolver=dns) as http:
            try:
                return (await http.post(url, content=b"{}")).status_code
            except httpx.HTTPError as exc:
                return exc
    async with outbound.client2(rules, httpx2.Timeout(5), None, resolver=dns) as http2:
        try:
            return (await http2.post(url, content=b"{}")).status_code
        except httpx2.HTTPError as exc:
            return exc


@pytest.mark.parametrize("flavour", ["httpx", "httpx2"])
def test_a_name_reaches_only_admitted_addresses(receiver: Receiver, flavour: str) -> None:
    port = receiver.port
    dns = Dns(
        {
            "both.example": [["169.254.169.254", "127.0.0.1"]],
            "meta.example": [["169.254.169.254", "fe80::1"]],
            "evil.localhost": [["10.9.9.9"]],
            "rebind.example": [["127.0.0.1"], ["169.254.169.254"]],
        }
    )

    def run(rules: tuple[HostRule, ...], host: str) -> Any:
        return asyncio.run(post(rules, dns, f"http://{host}:{port}/hook", flavour))

    # under "*": the link-local answer is passed over, the loopback one connected to
    assert run(STAR, "both.example") == 200
    refused = run(STAR, "meta.example")
    assert isinstance(refused, (httpx.ConnectError, httpx2.ConnectError)), refused
    assert "169.254.169.254" in str(refused) and "none of which" in str(refused)
    # a .localhost name is loopback only if it resolves there
    assert isinstance(run(NONE, "evil.localhost"), (httpx.ConnectError, httpx2.ConnectError))
    # rebinding: checked where each connection is made, on the answer used for it
    assert run(STAR, "rebind.example") == 200
    assert isinstance(run(STAR, "rebind.example"), (httpx.ConnectError, httpx2.ConnectError))
    assert dns.looks.count("rebind.example") == 2
    # numeric forms: the address the resolver reads
    assert run(NONE, "2130706433") == 200
    assert run(NONE, "0x7f.1") == 200
    assert len(receiver.received()) == 4


def test_an_exact_entry_is_trusted_with_what_it_resolves_to(receiver: Receiver) -> None:
    # 0.0.0.0 is no loopback address (Linux connects it to this machine all the same)
    dns = Dns({"hooks.internal": [["0.0.0.0"]]})
    url = f"http://hooks.internal:{receiver.port}/hook"
    assert isinstance(asyncio.run(post(NONE, dns, url)), httpx.ConnectError)
    rules = parse_hosts(f"hooks.internal:{receiver.port}", "X")
    assert asyncio.run(post(rules, dns, url)) == 200
    assert len(receiver.received()) == 1


def test_no_proxy_from_the_environment(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # a proxy would connect in lmsp's place
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, dead)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    dns = Dns({})
    for flavour in ("httpx", "httpx2"):
        assert asyncio.run(post(NONE, dns, receiver.url, flavour)) == 200
    assert len(receiver.received()) == 2
