"""The hosts rule of webhooks and MCP servers, pure: a host is read as the resolver reads
it (every numeric form ``inet_aton`` takes, IPv6 carrying IPv4), a URL is judged as
written, and each resolved address where the connection is made."""

from __future__ import annotations

import socket

import pytest

from lmsp.protocol import outbound

STAR = outbound.parse_hosts("*", "X")
NONE: tuple[outbound.HostRule, ...] = ()


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7f.0.1", "127.0.0.1"),
        ("2852039166", "169.254.169.254"),
        ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),
        ("169.254.43518", "169.254.169.254"),
        ("169.16689662", "169.254.169.254"),
        ("::ffff:169.254.169.254", "169.254.169.254"),
        ("0", "0.0.0.0"),
        ("0x", None),
        ("08.1.1.1", None),
        ("256.1.1.1", None),
        ("1.2.3.4.5", None),
        ("4294967296", None),
        ("example.com", None),
    ],
)
def test_numeric_forms_are_the_addresses_they_name(host: str, expected: str | None) -> None:
    found = outbound.address(host)
    assert (None if found is None else str(found)) == expected


@pytest.mark.parametrize(
    "host", ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "0x7f.1", "2852039166", "0"]
)
def test_the_reading_is_the_resolvers(host: str) -> None:
    """The system's resolver maps every form read as an address to that address."""
    resolved = {info[4][0] for info in socket.getaddrinfo(host, 80, type=socket.SOCK_STREAM)}
    assert resolved == {str(outbound.address(host))}


@pytest.mark.parametrize(
    ("host", "the_address"),
    [
        ("2852039166", True),
        ("0xa9fea9fe", True),
        ("169.254.43518", True),
        ("[::ffff:a9fe:a9fe]", True),
        ("0251.0376.0251.0376", False),  # four parts with leading zeros: no address at all
        ("[::a9fe:a9fe]", False),  # IPv4-compatible, NAT64, 6to4, Teredo: other addresses
        ("[64:ff9b::a9fe:a9fe]", False),  # that carry it
        ("[2002:a9fe:a9fe::]", False),
        ("[2001:0:4136:e378:8000:63bf:5601:5601]", False),  # Teredo, client 169.254.169.254
        ("[fe80::1%25eth0]", False),
    ],
)
def test_link_local_in_any_form_is_refused_under_a_star(host: str, the_address: bool) -> None:
    with pytest.raises(outbound.InvalidUrl):
        outbound.check_url(f"http://{host}/latest", STAR, "webhook", "X")
    # an exact entry of the address allows it in any form that is that address
    exact = outbound.parse_hosts("169.254.169.254", "X")
    assert outbound.allows(f"http://{host}/latest", exact) is the_address


def test_loopback_forms_and_names() -> None:
    for host in ("2130706433", "0x7f.1", "127.1", "[::ffff:127.0.0.1]", "localhost", "a.localhost"):
        assert outbound.allows(f"http://{host}:9/", NONE), host
    for host in ("167772161", "10.1", "example.com", "[::ffff:a00:1]", "0", "localhost.example"):
        assert not outbound.allows(f"http://{host}:9/", NONE), host
    for host in ("0177.0.0.1", "127.0.0.256", "1.2.3.0400"):  # four parts, no address
        with pytest.raises(outbound.InvalidUrl, match="no IPv4 address"):
            outbound.check_url(f"http://{host}/", STAR, "webhook", "X")


def test_an_address_is_admitted_where_the_connection_is_made() -> None:
    # loopback always; under "*" anything but link-local
    assert outbound.admits("a.example", 80, "127.0.0.1", NONE)
    assert outbound.admits("a.example", 80, "::ffff:127.0.0.1", NONE)
    assert not outbound.admits("a.example", 80, "10.0.0.1", NONE)
    assert outbound.admits("a.example", 80, "10.0.0.1", STAR)
    for near in ("169.254.169.254", "fe80::1%eth0", "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe"):
        assert not outbound.admits("a.example", 80, near, STAR), near
    # a name under localhost that resolves elsewhere gets nothing
    assert not outbound.admits("evil.localhost", 80, "10.0.0.1", NONE)
    assert not outbound.admits("localhost", 80, "169.254.169.254", STAR)
    # an exact entry: the host as listed (by name, any address) or the address itself
    named = outbound.parse_hosts("meta.internal:80", "X")
    assert outbound.admits("meta.internal", 80, "169.254.169.254", named)
    assert not outbound.admits("meta.internal", 81, "169.254.169.254", named)
    listed = outbound.parse_hosts("0xa9fea9fe", "X")  # entries are read the same way
    assert listed == (outbound.HostRule("169.254.169.254", None),)
    assert outbound.admits("other.example", 80, "169.254.169.254", listed)
    assert not outbound.admits("a.example", 80, "not an address", STAR)
