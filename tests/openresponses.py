"""Pydantic models of what a Responses server emits, written from the Open Responses
OpenAPI document (``ResponseResource``, its items, and the streaming events), for tests.

Every field the schema lists as required is required here, with its type (strict: an
integer is not a string, ``null`` only where the schema allows it). Extra fields are
allowed: lmsp adds ``model_digest`` and ``task`` to the object, and ``resumed``,
``attempt``, ``reset`` to some lifecycle events. ``response.cancelled`` (chapter 11.3)
and the LMSP lifecycle extensions carry the response like every lifecycle event.
:func:`check_object` and :func:`check_event` also parse with the openai SDK's types.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import openai.types.chat as chat_types
import openai.types.responses as sdk
from openai._models import construct_type
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


# -- content ---------------------------------------------------------------------------------
class TopLogProb(Model):
    token: str
    logprob: float
    bytes: list[int]


class LogProb(Model):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogProb]


class UrlCitation(Model):
    type: Literal["url_citation"]
    url: str
    start_index: int
    end_index: int
    title: str


class OutputTextContent(Model):
    type: Literal["output_text"]
    text: str
    annotations: list[UrlCitation]
    logprobs: list[LogProb]


class RefusalContent(Model):
    type: Literal["refusal"]
    refusal: str


Content = Annotated[OutputTextContent | RefusalContent, Field(discriminator="type")]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


# -- items -----------------------------------------------------------------------------------
class Message(Model):
    type: Literal["message"]
    id: str
    status: ItemStatus
    role: Literal["user", "assistant", "system", "developer"]
    content: list[Content]


class FunctionCall(Model):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


Item = Annotated[Message | FunctionCall, Field(discriminator="type")]


# -- the response object ---------------------------------------------------------------------
class InputTokensDetails(Model):
    cached_tokens: int


class OutputTokensDetails(Model):
    reasoning_tokens: int


class Usage(Model):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens_details: OutputTokensDetails


class Error(Model):
    code: str
    message: str


class IncompleteDetails(Model):
    reason: str


class FunctionTool(Model):
    type: Literal["function"]
    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None


class FunctionToolChoice(Model):
    type: Literal["function"]
    name: str | None = None


class AllowedToolChoice(Model):
    type: Literal["allowed_tools"]
    tools: list[FunctionToolChoice]
    mode: Literal["none", "auto", "required"]


ToolChoice = (
    Literal["none", "auto", "required"]
    | Annotated[FunctionToolChoice | AllowedToolChoice, Field(discriminator="type")]
)


class TextFormatText(Model):
    type: Literal["text"]


class TextFormatJsonObject(Model):
    type: Literal["json_object"]


class TextFormatJsonSchema(Model):
    type: Literal["json_schema"]
    name: str
    description: str | None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")]
    strict: bool


class TextField(Model):
    format: Annotated[
        TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")
    ]
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(Model):
    effort: str | None
    summary: str | None


class ResponseResource(Model):
    id: str
    object: Literal["response"]
    created_at: int
    completed_at: int | None
    status: str
    incomplete_details: IncompleteDetails | None
    model: str
    previous_response_id: str | None
    instructions: str | None
    output: list[Item]
    error: Error | None
    tools: list[FunctionTool]
    tool_choice: ToolChoice
    truncation: Literal["auto", "disabled"]
    parallel_tool_calls: bool
    text: TextField
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    top_logprobs: int
    temperature: float
    reasoning: Reasoning | None
    usage: Usage | None
    max_output_tokens: int | None
    max_tool_calls: int | None
    store: bool
    background: bool
    service_tier: str
    metadata: Annotated[dict[str, str], Field(max_length=16)]
    safety_identifier: str | None
    prompt_cache_key: str | None


# -- streaming events ------------------------------------------------------------------------
class Lifecycle(Model):
    type: Literal[
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.completed",
        "response.failed",
        "response.incomplete",
        "response.cancelled",  # chapter 11.3
        "response.loading",  # LMSP extension
        "response.cancelling",  # LMSP extension
    ]
    sequence_number: int
    response: ResponseResource


class OutputItemEvent(Model):
    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int
    item: Item


class ContentPartEvent(Model):
    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: Content


class OutputTextDelta(Model):
    type: Literal["response.output_text.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[LogProb]


class OutputTextDone(Model):
    type: Literal["response.output_text.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[LogProb]


class ArgumentsDelta(Model):
    type: Literal["response.function_call_arguments.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class ArgumentsDone(Model):
    type: Literal["response.function_call_arguments.done"]
    sequence_number: int
    item_id: str
    output_index: int
    arguments: str


StreamEvent = Annotated[
    Lifecycle
    | OutputItemEvent
    | ContentPartEvent
    | OutputTextDelta
    | OutputTextDone
    | ArgumentsDelta
    | ArgumentsDone,
    Field(discriminator="type"),
]
EVENT: TypeAdapter[Any] = TypeAdapter(StreamEvent)
SDK_EVENT: TypeAdapter[Any] = TypeAdapter(sdk.ResponseStreamEvent)
#: lifecycle events the openai SDK's event union does not list (it passes them through)
NOT_IN_SDK = {"response.cancelled", "response.loading", "response.cancelling"}


def _for_sdk(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the SDK's strict validation can take it. The SDK types
    ``error.code`` as OpenAI's own list of codes; lmsp's codes (``engine_error``,
    ``server_restarted`` …, PROTOCOL.md section 6) are strings the Open Responses schema
    allows, and the SDK's response parsing (which builds models without validating
    them) hands them through unchanged."""
    if obj.get("error") is None:
        return obj
    parsed = construct_type(type_=sdk.Response, value=obj)
    assert parsed.error is not None and parsed.error.code == obj["error"]["code"]
    return {**obj, "error": {**obj["error"], "code": "server_error"}}


def check_object(obj: dict[str, Any]) -> ResponseResource:
    """Validate a response object against the schema and the SDK's ``Response``."""
    sdk.Response.model_validate(_for_sdk(obj))
    return ResponseResource.model_validate(obj)


def check_event(event: dict[str, Any]) -> Any:
    """Validate one streamed event against the schema and the SDK's event types."""
    checked = EVENT.validate_python(event)
    if event["type"] in NOT_IN_SDK:
        sdk.Response.model_validate(_for_sdk(event["response"]))
    else:
        if "response" in event:
            event = {**event, "response": _for_sdk(event["response"])}
        parsed = SDK_EVENT.validate_python(event)
        assert parsed.type == event["type"]
    return checked


# -- chat completions (the openai SDK's types are the reference there) ----------------------
def check_completion(obj: dict[str, Any]) -> chat_types.ChatCompletion:
    return chat_types.ChatCompletion.model_validate(obj)


def check_chunk(obj: dict[str, Any]) -> chat_types.ChatCompletionChunk:
    return chat_types.ChatCompletionChunk.model_validate(obj)
