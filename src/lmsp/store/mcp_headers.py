"""MCP tools' header values (tokens for the MCP servers), kept apart from the stored
request, which shows them as ``[redacted]``: written in the transaction that creates
the response, read by the task's loop, deleted with the response (and when its task
finishes). Never logged, never in an answer."""

from __future__ import annotations

import json

from lmsp.store.sql import Conn


def keep(conn: Conn, response_id: str, headers: dict[str, dict[str, str]]) -> None:
    conn.execute(
        "INSERT INTO mcp_headers (response_id, headers) VALUES (?, ?)",
        (response_id, json.dumps(headers, separators=(",", ":"))),
    )


def read(conn: Conn, response_id: str) -> dict[str, dict[str, str]]:
    """``{server_label: {name: value}}`` (empty when there are none, or no more)."""
    row = conn.execute(
        "SELECT headers FROM mcp_headers WHERE response_id = ?", (response_id,)
    ).fetchone()
    if row is None:
        return {}
    value: dict[str, dict[str, str]] = json.loads(row[0])
    return value


def forget(conn: Conn, response_id: str) -> None:
    conn.execute("DELETE FROM mcp_headers WHERE response_id = ?", (response_id,))
