"""Render stored rows as the wire objects of PROTOCOL.md sections 4 and 5 (pure)."""

from __future__ import annotations

import json
from typing import Any, Protocol

from lmsp.tasks.states import Status, response_status


class Row(Protocol):
    """A stored row (``sqlite3.Row`` or a mapping)."""

    def __getitem__(self, key: str, /) -> Any: ...


def load_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def output_text(response: Row, task: Row) -> str:
    if response["output_text"] is not None:
        return str(response["output_text"])
    snapshot = load_json(task["snapshot"])
    return str(snapshot.get("text", "")) if snapshot else ""


def task_error(task: Row) -> dict[str, str] | None:
    if task["error_code"] is None:
        return None
    return {"code": task["error_code"], "message": task["error_message"] or ""}


def message_item(response: Row, task: Row, text: str | None = None) -> dict[str, Any]:
    status = Status(task["status"])
    item_status = "in_progress"
    if status is Status.COMPLETED:
        item_status = "incomplete" if response["incomplete_reason"] else "completed"
    elif status.terminal:
        item_status = "incomplete"
    return {
        "type": "message",
        "id": response["message_id"],
        "role": "assistant",
        "status": item_status,
        "content": [
            {
                "type": "output_text",
                "text": output_text(response, task) if text is None else text,
                "annotations": [],
                "logprobs": [],
            }
        ],
    }


def render_task_brief(task: Row, queue_position: int | None) -> dict[str, Any]:
    return {
        "id": task["id"],
        "status": task["status"],
        "on_restart": task["on_restart"],
        "attempt": task["attempt"],
        "queue_position": queue_position,
    }


def render_response(response: Row, task: Row, queue_position: int | None) -> dict[str, Any]:
    request = json.loads(response["request"])
    status = Status(task["status"])
    text = output_text(response, task)
    output: list[dict[str, Any]] = []
    if text or status is Status.COMPLETED:
        output.append(message_item(response, task, text))
    incomplete = response["incomplete_reason"]
    return {
        "id": response["id"],
        "object": "response",
        "created_at": response["created_at"],
        "status": response_status(status, incomplete=bool(incomplete)),
        "model": response["model"],
        "output": output,
        "error": task_error(task),
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "usage": load_json(response["usage"]),
        "background": bool(response["background"]),
        "store": bool(response["store"]),
        "metadata": request.get("metadata") or {},
        "max_output_tokens": request.get("max_output_tokens"),
        "temperature": request.get("temperature"),
        "top_p": request.get("top_p"),
        "instructions": request.get("instructions"),
        "parallel_tool_calls": False,
        "tool_choice": "none",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "model_digest": response["model_digest"],
        "task": render_task_brief(task, queue_position),
    }


def render_task(task: Row, queue_position: int | None) -> dict[str, Any]:
    return {
        "id": task["id"],
        "object": "task",
        "response_id": task["response_id"],
        "status": task["status"],
        "on_restart": task["on_restart"],
        "attempt": task["attempt"],
        "created_at": task["created_at"],
        "updated_at": task["updated_at"],
        "finished_at": task["finished_at"],
        "last_sequence_number": task["last_sequence_number"],
        "queue_position": queue_position,
        "error": task_error(task),
    }
