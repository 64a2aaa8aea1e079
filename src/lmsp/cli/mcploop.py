"""The MCP loop of a response as ``lmsp tasks show`` prints it: each tool list, call
(arguments, result or error) and approval request, in output order."""

from __future__ import annotations

from typing import Any

from lmsp.cli.remote import table
from lmsp.cli.safe import clean

MAX_SHOWN = 200


def _short(text: Any) -> str:
    shown = clean(text if isinstance(text, str) else str(text))
    return shown if len(shown) <= MAX_SHOWN else shown[:MAX_SHOWN] + "…"


def _error(error: Any) -> str:
    if isinstance(error, dict):
        if "message" in error:
            return str(error["message"])
        texts = [c.get("text", "") for c in error.get("content") or [] if isinstance(c, dict)]
        return " ".join(texts)
    return str(error)


def rows(response: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    out: list[tuple[str, str, str, str, str]] = []
    for item in response.get("output") or []:
        kind = item.get("type")
        if kind == "mcp_list_tools":
            names = ", ".join(t.get("name", "?") for t in item.get("tools") or [])
            error = item.get("error")
            out.append(
                (
                    "list",
                    item.get("server_label", ""),
                    "",
                    "failed" if error else "completed",
                    _short(error or names or "(no tools)"),
                )
            )
        elif kind == "mcp_call":
            error = item.get("error")
            result = f"error: {_error(error)}" if error is not None else item.get("output") or ""
            out.append(
                (
                    f"call {item.get('name', '')}({_short(item.get('arguments', ''))})",
                    item.get("server_label", ""),
                    item.get("approval_request_id") or "",
                    str(item.get("status", "")),
                    _short(result),
                )
            )
        elif kind == "mcp_approval_request":
            out.append(
                (
                    f"approval? {item.get('name', '')}({_short(item.get('arguments', ''))})",
                    item.get("server_label", ""),
                    item.get("id", ""),
                    "waiting",
                    "answer with an mcp_approval_response",
                )
            )
    return out


def show(response: dict[str, Any]) -> None:
    """Print the loop's table (nothing for a response without MCP items)."""
    found = rows(response)
    if found:
        table("MCP loop", ["STEP", "SERVER", "APPROVAL", "STATUS", "RESULT"], found)
