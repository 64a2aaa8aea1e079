"""The wire objects of PROTOCOL.md sections 4 and 5, rendered from stored records (pure).

A response's ``output`` is given by the caller: the stored items once the task has
finished, or the items its event log describes while it runs
(:func:`lmsp.protocol.assembler.items_from_events`).
"""

from __future__ import annotations

from typing import Any

from lmsp.errors import LmspError
from lmsp.protocol import items
from lmsp.protocol.itemtypes import plain, plain_all
from lmsp.protocol.records import ResponseRecord, TaskRecord
from lmsp.protocol.request import (
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    Brief,
    PreparedRequest,
    Reasoning,
    TextConfig,
    Truncated,
)
from lmsp.protocol.states import Status, response_status
from lmsp.protocol.tools import AllowedTools, FunctionTool, Tool, ToolChoice


def render_task_brief(task: TaskRecord, queue_position: int | None) -> dict[str, Any]:
    return {
        "id": task.id,
        "status": task.status.value,
        "on_restart": task.on_restart.value,
        "attempt": task.attempt,
        "queue_position": queue_position,
    }


def _number(value: Any, default: float) -> float:
    return default if value is None else float(value)


def usage_counts(input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> dict[str, int]:
    """A task's usage as it is stored: the prompt tokens given to the engine (of them,
    ``cached_tokens`` read from a cached prefix) and the tokens it generated."""
    return {
        "cached_tokens": cached_tokens,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }


def render_usage(stored: dict[str, Any] | None) -> dict[str, Any] | None:
    if stored is None:
        return None
    return {
        "input_tokens": stored["input_tokens"],
        # the prompt tokens read from a cached prefix (in memory or saved on disk)
        "input_tokens_details": {
            "cached_tokens": stored.get("cached_tokens", 0),
            "cache_write_tokens": 0,
        },
        "output_tokens": stored["output_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": stored["total_tokens"],
    }


def render_tool(tool: Tool) -> dict[str, Any]:
    """A tool as the response echoes it: every field of a ``FunctionTool`` present."""
    if not isinstance(tool, FunctionTool):
        return plain(tool)  # a hosted tool not offered to the model says ``offered: false``
    shown: dict[str, Any] = {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": tool.is_strict,
    }
    if tool.namespace:  # one of a namespace's tools, flattened
        shown["namespace"] = tool.namespace
    return shown


def _reasoning(given: Reasoning | None) -> dict[str, Any] | None:
    if given is None or given == Reasoning():
        return None
    return {"effort": given.effort, "summary": given.summary}


def render_tool_choice(choice: ToolChoice | None) -> Any:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        return choice
    if isinstance(choice, AllowedTools):
        return {"mode": "auto", **plain(choice)}
    return plain(choice)


def render_text(text: TextConfig | None) -> dict[str, Any]:
    """``text`` as asked, ``{"format": {"type": "text"}}`` by default."""
    shown = plain(text) if text is not None else {}
    shown["format"] = shown.get("format") or {"type": "text"}
    return shown


def render_response(
    response: ResponseRecord,
    task: TaskRecord,
    output: list[dict[str, Any]],
    queue_position: int | None,
) -> dict[str, Any]:
    """The response object: every field of the Open Responses ``ResponseResource``, plus
    the LMSP extensions ``model_digest``, ``task`` and ``truncated_input`` (``null``, or
    the oldest input items ``truncation: "auto"`` dropped: ``{"items": n, "first":
    {"id", "type", "role"}, "last": {…}}``)."""
    request = response.request
    status = task.status
    incomplete = response.incomplete_reason
    shown = response_status(status, incomplete=bool(incomplete))
    completed_at = task.finished_at if status is Status.COMPLETED else None
    return {
        "id": response.id,
        "object": "response",
        "created_at": response.created_at,
        "completed_at": completed_at,
        "status": shown,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "model": response.model,
        "previous_response_id": request.previous_response_id,
        "instructions": request.instructions,
        "output": output,
        "error": task.error,
        "tools": [render_tool(tool) for tool in request.tools or ()],
        "tool_choice": render_tool_choice(request.tool_choice),
        "truncation": request.truncation or "disabled",
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "text": render_text(request.text),
        "top_p": _number(request.top_p, DEFAULT_TOP_P),
        "presence_penalty": _number(request.presence_penalty, 0.0),
        "frequency_penalty": _number(request.frequency_penalty, 0.0),
        "top_logprobs": int(request.top_logprobs or 0),
        "temperature": _number(request.temperature, DEFAULT_TEMPERATURE),
        # LMSP extensions: the other sampling numbers the task runs with
        "top_k": int(request.top_k or 0),
        "min_p": _number(request.min_p, 0.0),
        "repeat_penalty": _number(request.repeat_penalty, 1.0),
        # as asked: the models here do no reasoning, so no item and no summary come of it
        "reasoning": _reasoning(request.reasoning),
        "user": request.user,
        "usage": render_usage(response.usage),
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "store": response.store,
        "background": response.background,
        "service_tier": tier_used(request.service_tier),
        "metadata": request.metadata or {},
        "safety_identifier": request.safety_identifier,
        "prompt_cache_key": request.prompt_cache_key,
        "model_digest": response.model_digest,
        "task": render_task_brief(task, queue_position),
        # LMSP extension: what ``truncation: "auto"`` left out of the model's context
        "truncated_input": render_truncated(request.truncated),
        # ``{"id"}`` of the conversation it joins
        "conversation": plain(request.conversation) if request.conversation else None,
    }


def render_truncated(recorded: Truncated | None) -> dict[str, Any] | None:
    """What ``truncation: "auto"`` left out: ``{"items": n, "first": {...}, "last":
    {...}}`` (a request stored with the whole ``dropped`` list, before, shown alike; the
    count ``kept`` is lmsp's own, for its runner)."""
    if recorded is None:
        return None
    first, last = recorded.first, recorded.last
    if recorded.dropped:
        first, last = recorded.dropped[0], recorded.dropped[-1]
    return {"items": recorded.items, "first": _brief(first), "last": _brief(last)}


def _brief(brief: Brief | None) -> dict[str, Any] | None:
    return None if brief is None else {"id": brief.id, "type": brief.type, "role": brief.role}


def render_task(task: TaskRecord, queue_position: int | None) -> dict[str, Any]:
    return {
        "id": task.id,
        "object": "task",
        "response_id": task.response_id,
        "status": task.status.value,
        "on_restart": task.on_restart.value,
        "attempt": task.attempt,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
        "finished_at": task.finished_at,
        "last_sequence_number": task.last_sequence_number,
        "queue_position": queue_position,
        "error": task.error,
    }


def input_items_page(
    request: PreparedRequest, order: str = "desc", after: str | None = None, limit: int = 20
) -> dict[str, Any]:
    """``GET /v1/responses/{id}/input_items``: the items the model was given (the
    conversation's earlier turns, then the request's input), ``order`` ``asc`` (oldest
    first) or ``desc``, the page after the item ``after``."""
    listed = [_as_given(item) for item in plain_all((*(request.history or ()), *request.input))]
    if order == "desc":
        listed.reverse()
    start = 0
    if after is not None:
        ids = [item.get("id") for item in listed]
        if after not in ids:
            raise LmspError("not_found", f"No input item with id {after!r}.", param="after")
        start = ids.index(after) + 1
    return list_page(listed[start : start + limit], start + limit < len(listed))


def list_page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """One page of a list (OpenAI's shape): its items, the first and last ids (cursors
    for ``after``), and whether more follow."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def _as_given(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as the client gave it: without the text lmsp read from its files."""
    if item.get("type") != "message" or not any(
        items.FILE_TEXT in part for part in item.get("content") or ()
    ):
        return item
    content = [{k: v for k, v in part.items() if k != items.FILE_TEXT} for part in item["content"]]
    return {**item, "content": content}


def tier_used(asked: Any) -> str:
    """The service tier a response ran in: ``priority``, ``flex``, else ``default``
    (``auto`` and no tier run as ``default``)."""
    return asked if asked in ("priority", "flex") else "default"
