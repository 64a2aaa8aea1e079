"""Event names (PROTOCOL.md section 6): which are lifecycle, terminal, standard
Responses types or LMSP extensions."""

from __future__ import annotations

from typing import Any

from lmsp.protocol.states import Status

CREATED = "response.created"
QUEUED = "response.queued"
LOADING = "response.loading"  # LMSP extension
IN_PROGRESS = "response.in_progress"
CANCELLING = "response.cancelling"  # LMSP extension
COMPLETED = "response.completed"
INCOMPLETE = "response.incomplete"
FAILED = "response.failed"
CANCELLED = "response.cancelled"

OUTPUT_ITEM_ADDED = "response.output_item.added"
OUTPUT_ITEM_DONE = "response.output_item.done"
CONTENT_PART_ADDED = "response.content_part.added"
CONTENT_PART_DONE = "response.content_part.done"
OUTPUT_TEXT_DELTA = "response.output_text.delta"
OUTPUT_TEXT_DONE = "response.output_text.done"
FUNCTION_CALL_ARGUMENTS_DELTA = "response.function_call_arguments.delta"
FUNCTION_CALL_ARGUMENTS_DONE = "response.function_call_arguments.done"

#: the event a task logs on entering each state
LIFECYCLE: dict[Status, str] = {
    Status.QUEUED: QUEUED,
    Status.LOADING: LOADING,
    Status.RUNNING: IN_PROGRESS,
    Status.CANCELLING: CANCELLING,
    Status.COMPLETED: COMPLETED,
    Status.FAILED: FAILED,
    Status.CANCELLED: CANCELLED,
}

#: a task's log ends with exactly one of these
TERMINAL = frozenset({COMPLETED, INCOMPLETE, FAILED, CANCELLED})

#: LMSP lifecycle extensions: in the log and the task event stream, and in a responses
#: stream only when asked for (``include=lmsp.lifecycle``)
LMSP_LIFECYCLE = frozenset({LOADING, CANCELLING})

#: the ``include`` value that shows the LMSP lifecycle extensions in a responses stream
INCLUDE_LIFECYCLE = "lmsp.lifecycle"

#: every event whose payload carries the response object as ``response``
WITH_RESPONSE = frozenset(
    {CREATED, QUEUED, LOADING, IN_PROGRESS, CANCELLING, COMPLETED, INCOMPLETE, FAILED, CANCELLED}
)

#: the output events the assembler emits, in the order the Responses API gives them
OUTPUT = frozenset(
    {
        OUTPUT_ITEM_ADDED,
        OUTPUT_ITEM_DONE,
        CONTENT_PART_ADDED,
        CONTENT_PART_DONE,
        OUTPUT_TEXT_DELTA,
        OUTPUT_TEXT_DONE,
        FUNCTION_CALL_ARGUMENTS_DELTA,
        FUNCTION_CALL_ARGUMENTS_DONE,
    }
    # the MCP loop's (OpenAI's names; :mod:`lmsp.protocol.mcp`)
    | {
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
        "response.mcp_call.failed",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_list_tools.failed",
    }
)


#: what a responses stream carries by default: the standard Responses event types lmsp
#: emits, plus ``response.cancelled`` (chapter 11.3 requires it)
STANDARD = (
    frozenset({CREATED, QUEUED, IN_PROGRESS, COMPLETED, INCOMPLETE, FAILED, CANCELLED}) | OUTPUT
)


def hidden_in_stream(include: list[str] | tuple[str, ...] | None) -> frozenset[str]:
    """The event types a ``/v1/responses`` stream leaves out for these ``include`` values
    (they stay in the log and in ``/v1/tasks/{id}/events``)."""
    return frozenset() if include and INCLUDE_LIFECYCLE in include else LMSP_LIFECYCLE


def terminal_for(status: Status, incomplete: bool = False) -> str:
    """The terminal event of a finished task."""
    if status is Status.COMPLETED and incomplete:
        return INCOMPLETE
    return LIFECYCLE[status]


def lifecycle(kind: str, response: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A lifecycle event carrying the response object (no sequence number yet: the log
    gives it)."""
    return {"type": kind, **extra, "response": response}


#: delta events that may be joined with the next one of the same item (and part)
_JOINABLE = {
    OUTPUT_TEXT_DELTA: ("item_id", "content_index"),
    FUNCTION_CALL_ARGUMENTS_DELTA: ("item_id",),
}


def coalesce(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``batch`` with each run of deltas of one item (and content part) joined into one
    event: the same text, arguments and logprobs, in fewer events. A log read back or
    replayed gives the same items either way."""
    out: list[dict[str, Any]] = []
    for event in batch:
        keys = _JOINABLE.get(event.get("type", ""))
        last = out[-1] if out else None
        if (
            keys is not None
            and last is not None
            and last.get("type") == event["type"]
            and all(last.get(k) == event.get(k) for k in keys)
        ):
            joined = dict(last, delta=last["delta"] + event["delta"])
            if "logprobs" in last or "logprobs" in event:
                joined["logprobs"] = list(last.get("logprobs") or []) + list(
                    event.get("logprobs") or []
                )
            out[-1] = joined
        else:
            out.append(event)
    return out
