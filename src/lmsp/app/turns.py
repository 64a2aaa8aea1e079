"""The two create fields that shape a turn's context: ``conversation`` (its items come
first, the turn is appended when it finishes) and ``context_management`` (compact the
older items first when the prompt passes a threshold). Read once, checked together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmsp.errors import LmspError, unsupported

MAX_ID = 256


@dataclass(frozen=True)
class Turn:
    #: the conversation the turn belongs to, ``None`` for none
    conversation: str | None = None
    #: compact the older items first when the prompt passes this many tokens
    compact_over: int | None = None


def _conversation(value: Any) -> str | None:
    if value is None:
        return None
    given = value.get("id") if isinstance(value, dict) else value
    if isinstance(value, dict) and set(value) - {"id"}:
        extra = sorted(set(value) - {"id"})[0]
        raise unsupported(f"conversation.{extra}", f"conversation has no field {extra!r}.")
    if not isinstance(given, str) or not given.startswith("conv_") or len(given) > MAX_ID:
        raise LmspError(
            "invalid_value",
            'conversation: a conversation id ("conv_…") or {"id": "conv_…"}.',
            param="conversation",
        )
    return given


def _threshold(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 1 or not isinstance(value[0], dict):
        raise LmspError(
            "invalid_value",
            'context_management: a list of one {"type": "compaction", "compact_threshold": N}.',
            param="context_management",
        )
    entry = value[0]
    if entry.get("type") != "compaction":
        raise unsupported(
            "context_management.0.type", "Only compaction is supported as context management."
        )
    for key in entry:
        if key not in ("type", "compact_threshold"):
            raise unsupported(
                f"context_management.0.{key}", f"A compaction entry has no field {key!r} here."
            )
    threshold = entry.get("compact_threshold")
    if threshold is None:
        raise LmspError(
            "missing_required_parameter",
            "context_management.0.compact_threshold: lmsp compacts only past a threshold"
            " you give (in input tokens).",
            param="context_management.0.compact_threshold",
        )
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise LmspError(
            "invalid_value",
            "context_management.0.compact_threshold: a positive number of tokens.",
            param="context_management.0.compact_threshold",
        )
    return threshold


def read(conversation: Any, context_management: Any, previous_response_id: str | None) -> Turn:
    """The turn's options, or ``400`` naming the field at fault. ``conversation`` and
    ``previous_response_id`` exclude each other (as OpenAI's API has it); compaction on a
    create works on the input the request carries, so it is refused with either (compact
    a stored history with ``POST /v1/responses/compact`` instead)."""
    turn = Turn(_conversation(conversation), _threshold(context_management))
    if turn.conversation is not None and previous_response_id is not None:
        raise LmspError(
            "invalid_value",
            "conversation and previous_response_id exclude each other: send one.",
            param="conversation",
        )
    if turn.compact_over is not None and (
        turn.conversation is not None or previous_response_id is not None
    ):
        raise unsupported(
            "context_management",
            "context_management compacts the input a request carries; with conversation or"
            " previous_response_id compact the history with POST /v1/responses/compact and"
            " send its output as input.",
        )
    return turn
