"""Pairing, the device flow of PROTOCOL.md section 2: an agent asks for a token (no
token needed), the operator approves or denies (``admin``), the agent claims its token
once. ``pairing_id`` in a decision is the request id or its user code (``ABCD-EFGH``),
so an operator can act on what the agent shows. Every decision is audited."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from lmsp.app.core import Core
from lmsp.store import audit, clients, limits, pairing
from lmsp.store.clients import Client
from lmsp.store.sql import Conn, Row


def _now() -> int:
    return int(time.time())


async def request(
    core: Core, client_name: str, scopes: Sequence[str], source: str, local: bool
) -> dict[str, Any]:
    """A new pairing request from the address ``source`` (``local``: a loopback one),
    within the limits on pending requests: the request object."""
    settings = core.settings
    wanted = clients.clean_scopes(scopes)
    # every agent on this machine comes from one loopback address: there the client
    # name tells them apart, and a per-address limit would let one block the others
    per_source = None if local else settings.max_pending_pairings_per_source
    # and peers beyond this machine together hold at most half the slots
    remote = max(1, settings.max_pending_pairings // 2) if pairing.is_remote(source) else None

    def job(conn: Conn) -> Row:
        return pairing.create(
            conn,
            client_name=client_name,
            scopes=wanted,
            ttl=int(settings.pairing_ttl),
            max_pending=settings.max_pending_pairings,
            now=_now(),
            source=source,
            max_per_source=per_source,
            max_per_name=settings.max_pending_pairings_per_name,
            max_remote=remote,
        )

    return pairing.render(await core.db.write(job))


async def pending(core: Core) -> list[dict[str, Any]]:
    """Pending, unexpired requests, oldest first."""
    rows = await core.read(lambda: pairing.pending(core.db.reader(), _now()))
    return [pairing.render(r) for r in rows]


async def deny_pending(core: Core, actor: Client, source: str | None) -> list[dict[str, Any]]:
    """Deny every pending request, or only those from ``source`` (an address as the
    list shows it): the operator frees the slots. The requests denied."""
    now = _now()

    def job(conn: Conn) -> list[str]:
        denied: list[str] = pairing.deny_pending(conn, now, source)
        for pairing_id in denied:
            audit.record(conn, actor.id, "pairing.denied", pairing_id, {"source": source})
        return denied

    ids = await core.db.write(job)

    def read() -> list[Row]:
        conn = core.db.reader()
        return [row for i in ids if (row := pairing.get(conn, i)) is not None]

    return [pairing.render(row) for row in await core.read(read)]


async def decide(
    core: Core, actor: Client, pairing_id: str, approve: bool, scopes: Sequence[str] | None = None
) -> dict[str, Any]:
    """Approve (optionally with fewer ``scopes`` than requested) or deny a request."""
    granted = None if scopes is None else clients.clean_scopes(scopes)

    def job(conn: Conn) -> Row:
        row = pairing.decide(conn, pairing_id, approve=approve, scopes=granted, now=_now())
        shown = pairing.render(row)
        audit.record(
            conn,
            actor.id,
            "pairing.approved" if approve else "pairing.denied",
            str(row["id"]),
            {"client_name": row["client_name"], "scopes": shown.get("granted_scopes")},
        )
        return row

    return pairing.render(await core.db.write(job))


async def claim(core: Core, pairing_id: str) -> dict[str, Any]:
    """``400`` (``authorization_pending``, ``access_denied``, ``expired_token``,
    ``already_claimed``) until approved; then the new client's token, exactly once,
    the client made with the default limits (``LMSP_DEFAULT_LIMITS``)."""
    defaults = dict(core.settings.default_limits)

    def job(conn: Conn) -> dict[str, Any]:
        result: dict[str, Any] = pairing.claim(conn, pairing_id, _now())
        limits.update(conn, result["client_id"], defaults)
        audit.record(
            conn,
            f"pairing:{pairing_id}",
            "client.created",
            result["client_id"],
            {"scopes": result.get("scopes"), "limits": limits.of(conn, result["client_id"])},
        )
        return result

    return await core.db.write(job)
