"""Recent refusals: the last ``4xx``/``5xx`` answers, with their client, for ``lmsp logs
--errors`` (``GET /v1/refusals``, admin).

Kept in a bounded ring in memory, not in a table: a refusal writes nothing (a bad
request must not become a write — a client retrying a bad request in a loop would
otherwise load the one writer and grow the database), and what a user looks for here is
why a client failed just now. The log (every ``4xx``/``5xx`` line names its ``code`` and
``param``) is the lasting record; a restart empties the ring.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

#: how many refusals are kept (the oldest go first)
KEPT = 256


@dataclass(frozen=True)
class Refusal:
    at: float
    method: str
    path: str
    status: int
    code: str | None
    param: str | None
    client_id: str | None
    request_id: str | None
    user_agent: str | None


class Refusals:
    def __init__(self, kept: int = KEPT) -> None:
        self._ring: deque[Refusal] = deque(maxlen=kept)

    def add(self, refusal: Refusal) -> None:
        self._ring.append(refusal)

    def recent(self, limit: int, client_id: str | None = None) -> list[dict[str, Any]]:
        """The newest first (``client_id``: that client's only)."""
        shown = [r for r in reversed(self._ring) if client_id in (None, r.client_id)]
        return [asdict(r) for r in shown[:limit]]


def refusal(
    scope: MutableMapping[str, Any],
    status: int,
    noted: dict[str, str | None],
    client_id: str | None,
) -> Refusal:
    headers = dict(scope.get("headers") or [])
    agent = headers.get(b"user-agent", b"").decode("latin-1")[:200] or None
    return Refusal(
        at=round(time.time(), 3),
        method=str(scope.get("method", "")),
        path=str(scope.get("path", ""))[:512],
        status=status,
        code=noted.get("code"),
        param=noted.get("param"),
        client_id=client_id,
        request_id=noted.get("request_id"),
        user_agent=agent,
    )
