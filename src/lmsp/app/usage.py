"""What clients used, and what was done to the service: the usage ledger's summary (a
client its own, ``admin`` everyone's) and the audit log (``admin``), PROTOCOL.md
section 13."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lmsp import errors
from lmsp.app.core import Core
from lmsp.protocol import objects
from lmsp.store import audit, usage
from lmsp.store.clients import Client


async def summary(
    core: Core,
    client: Client,
    client_id: str | None,
    since: int | None,
    until: int | None,
    group_by: Sequence[str],
) -> list[dict[str, Any]]:
    """Requests, input, cached and output tokens per client and per UTC day and/or
    model, over the days from ``since`` to ``until`` (Unix times). A client sees its
    own; ``admin`` everyone's, or one client's (``client_id``)."""
    if client_id is not None and not client.oversees(client_id):
        raise errors.not_found("client", client_id, param="client_id")
    wanted = client_id if client.admin else client.id
    if since is not None and until is not None and until < since:
        raise errors.invalid("until is before since.", param="until")
    rows: list[dict[str, Any]] = await core.read(
        lambda: usage.summary(core.db.reader(), wanted, since, until, tuple(group_by))
    )
    return rows


async def audit_page(
    core: Core, after: int, limit: int, target: str | None, action: str | None
) -> dict[str, Any]:
    """The audit log, oldest first, a page after the row id ``after``."""
    rows = await core.read(
        lambda: audit.page(
            core.db.reader(), after=after, limit=limit + 1, target=target, action=action
        )
    )
    shown = [audit.render(row) for row in rows[:limit]]
    return objects.list_page(shown, len(rows) > limit)
