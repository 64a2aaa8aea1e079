"""The Messages API's request bodies (pure parsing) and its field policy.

Unlike the OpenAI bodies, an unknown field is refused here, as Anthropic's API refuses
it (``400 invalid_request_error`` naming the field): an Anthropic client never sends
one by accident. Content blocks are plain objects, checked by
:mod:`lmsp.protocol.messages` with errors naming the block.

What a field asks and lmsp cannot do is refused (:func:`check_message`); what it asks
and lmsp does anyway is accepted:

- ``thinking: {"type": "adaptive"}`` (the model decides how much to think: these models
  never do) and ``{"type": "disabled"}``; ``enabled`` is refused;
- ``output_config.effort: "high"`` (Anthropic's default: the model's full effort) and
  ``output_config.format`` (structured output, by constrained decoding); other efforts
  are refused;
- ``context_management`` edits that clear thinking (there is none to clear);
- ``cache_control`` anywhere (lmsp reuses every prompt prefix it can by itself);
- ``service_tier`` ``auto`` or ``standard_only`` (there is one tier).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp.api.schemas import (
    Generation,
    ModelId,
    OutputTokens,
    StopString,
    ToolName,
    TopK,
    Unavailable,
    unavailable,
)
from lmsp.errors import LmspError, unsupported


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


#: Anthropic's own limit on one request's messages
MAX_MESSAGES = 100_000
#: blocks in one message
MAX_BLOCKS = 4096


class MessageParam(Strict):
    role: Literal["user", "assistant", "system"]
    content: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_BLOCKS)]


class CacheControl(Strict):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: ToolName | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(Strict):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = None
    display: Literal["summarized", "omitted"] | None = None


class OutputFormat(Strict):
    type: Literal["json_schema"]
    schema_: Annotated[dict[str, Any], Field(alias="schema")]


class OutputConfig(Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class ContextEdit(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")  # each edit type has its fields
    type: Annotated[str, StringConstraints(min_length=1, max_length=64)]


class ContextManagement(Strict):
    edits: Annotated[list[ContextEdit], Field(max_length=16)] | None = None


class Metadata(Strict):
    user_id: Annotated[str, StringConstraints(max_length=512)] | None = None


class CountTokens(Strict):
    """``POST /v1/messages/count_tokens``: what makes the prompt."""

    model: ModelId
    messages: Annotated[list[MessageParam], Field(min_length=1, max_length=MAX_MESSAGES)]
    system: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_BLOCKS)] | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None
    cache_control: CacheControl | None = None
    # Anthropic features lmsp does not have
    mcp_servers: Unavailable = None
    speed: Literal["standard", "fast"] | None = None


class MessageCreate(CountTokens, Generation):
    """``POST /v1/messages``: the whole create body (the fields every translated body
    shares, :class:`lmsp.api.schemas.Generation`, refusing unknown ones as Anthropic does)."""

    model_config = Strict.model_config
    max_tokens: OutputTokens
    stop_sequences: Annotated[list[StopString], Field(max_length=16)] | None = None
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_k: TopK | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    # Anthropic features lmsp does not have
    container: Unavailable = None
    inference_geo: Unavailable = None
    diagnostics: Unavailable = None
    user_profile_id: Unavailable = None
    workspace_id: Unavailable = None


def check_message(body: CountTokens) -> None:
    """Raise the first ``unsupported_parameter`` of a Messages body."""
    for problem in _problems(body):
        raise problem


def _problems(body: CountTokens) -> Iterator[LmspError]:
    yield from unavailable(body)
    if body.speed == "fast":
        yield unsupported("speed", "There is one speed here (standard).")
    thinking = body.thinking
    if thinking is not None and thinking.type in ("enabled", "between_tools"):
        yield unsupported(
            "thinking", 'The models here do not think: send {"type": "adaptive"} or "disabled".'
        )
    if thinking is not None and thinking.type != "enabled" and thinking.budget_tokens is not None:
        yield LmspError(
            "invalid_value", "budget_tokens goes with thinking enabled.", param="thinking"
        )
    effort = body.output_config.effort if body.output_config else None
    if effort not in (None, "high"):
        yield unsupported(
            "output_config.effort", 'Only effort "high" (the model\'s full effort) exists here.'
        )
    edits = body.context_management.edits if body.context_management else None
    for index, edit in enumerate(edits or []):
        if not edit.type.startswith("clear_thinking_"):
            yield unsupported(
                f"context_management.edits.{index}.type",
                f"Context edit {edit.type!r} is not supported here (only clearing thinking).",
            )
    choice = body.tool_choice
    if choice is not None:
        if choice.type == "tool" and choice.name is None:
            yield LmspError(
                "invalid_value", 'tool_choice "tool" needs a name.', param="tool_choice.name"
            )
        if choice.type != "tool" and choice.name is not None:
            yield LmspError(
                "invalid_value", 'Only tool_choice "tool" takes a name.', param="tool_choice.name"
            )
        if choice.type == "none" and choice.disable_parallel_tool_use is not None:
            yield LmspError(
                "invalid_value",
                'tool_choice "none" takes no disable_parallel_tool_use.',
                param="tool_choice.disable_parallel_tool_use",
            )
