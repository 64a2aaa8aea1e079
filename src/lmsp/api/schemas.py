"""Request bodies (pure parsing) and the field policy of PROTOCOL.md section 4.

Every field of the Responses create body (the Open Responses ``CreateResponseBody``, plus
the fields the OpenAI API adds and the LMSP extensions) and of the Chat Completions body
is declared here, typed and bounded. A malformed value is a ``400 invalid_value`` naming
the field (pydantic, through the app's handler). A well-formed value lmsp cannot honour
is a ``400 unsupported_parameter`` naming it (:func:`check_response`,
:func:`check_chat`). A field no API declares is ignored: OpenAI clients send new ones
before servers know them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from lmsp.app import toolcheck, tooldefs
from lmsp.errors import LmspError
from lmsp.errors import unsupported as unsupported  # the refusal the routes share
from lmsp.protocol.events import INCLUDE_LIFECYCLE


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class _Unavailable:
    """The mark of :data:`Unavailable` fields."""


# -- shared field types ---------------------------------------------------------------------
#: a field of the API's body that lmsp does not have, declared ``name: Unavailable = None``
#: so that a value is refused by name (:func:`unavailable`), never ignored
Unavailable = Annotated[Any, _Unavailable()]
ModelId = Annotated[str, StringConstraints(min_length=1, max_length=256)]
ToolName = Annotated[str, StringConstraints(pattern=rf"^{tooldefs.NAME.pattern}$")]
ShortId = Annotated[str, StringConstraints(max_length=64)]
MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]
Metadata = Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)]
Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(gt=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
TopLogprobs = Annotated[int, Field(ge=0, le=20)]
TopK = Annotated[int, Field(ge=0, le=100_000)]
MinP = Annotated[float, Field(ge=0, le=1)]
RepeatPenalty = Annotated[float, Field(gt=0, le=10)]
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]
OutputTokens = Annotated[int, Field(ge=1, le=1_000_000)]
StopString = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Stop = StopString | Annotated[list[StopString], Field(max_length=4)]
ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast"]
OnRestart = Literal["fail", "retry", "resume"]
Verbosity = Literal["low", "medium", "high"]
#: the tiers the claim orders by (PROTOCOL.md 13; ``priority`` needs its scope)
TIERS = (None, "auto", "default", "flex", "priority")
TIER_HELP = "The service tiers here are auto, default, flex and priority."

#: ``include`` values: lmsp's own, the two of Open Responses, the rest of OpenAI's
INCLUDABLE = frozenset(
    {
        INCLUDE_LIFECYCLE,
        "reasoning.encrypted_content",
        "message.output_text.logprobs",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
    }
)


# -- input -----------------------------------------------------------------------------------
#: one item of ``input``: a JSON object, checked and normalized by
#: :func:`lmsp.protocol.items.normalize` (which names the item and part at fault)
InputItem = dict[str, Any]
MAX_INPUT_ITEMS = 4096


# -- Responses ------------------------------------------------------------------------------
#: ``tools`` and ``tool_choice`` are JSON here and read by :mod:`.tooldefs`, the one
#: reading both APIs share (every malformed shape a 400 naming its place)
Tools = Annotated[list[Any], Field(max_length=128)]


class TextFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None


class TextConfig(Body):
    format: TextFormat | None = None
    verbosity: Verbosity | None = None


class ReasoningConfig(Body):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponseStreamOptions(Body):
    include_obfuscation: bool | None = None


class CreateResponse(Body):
    """``POST /v1/responses``: the whole create body."""

    model: ModelId
    input: (
        Annotated[str, StringConstraints(min_length=1)]
        | Annotated[list[InputItem], Field(min_length=1, max_length=MAX_INPUT_ITEMS)]
    )
    instructions: str | None = None
    previous_response_id: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = (
        None
    )
    include: Annotated[list[str], Field(max_length=16)] | None = None
    tools: Tools | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: Annotated[int, Field(ge=1, le=1000)] | None = None
    text: TextConfig | None = None
    max_output_tokens: OutputTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    top_logprobs: TopLogprobs | None = None
    stream: bool | None = None
    stream_options: ResponseStreamOptions | None = None
    background: bool | None = None
    store: bool | None = None
    metadata: Metadata | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: ServiceTier | None = None
    safety_identifier: ShortId | None = None
    prompt_cache_key: ShortId | None = None
    user: Annotated[str, StringConstraints(max_length=256)] | None = None
    # read by :mod:`.turns` (a conversation; compaction first)
    conversation: Any = None
    context_management: Any = None
    # OpenAI features lmsp does not have
    prompt: Unavailable = None
    prompt_cache_retention: Unavailable = None
    prompt_cache_options: Unavailable = None
    background_options: Unavailable = None
    moderation: Unavailable = None
    image: Unavailable = None
    access_programs: Unavailable = None
    # LMSP extensions
    seed: Seed | None = None
    on_restart: OnRestart | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    repeat_penalty: RepeatPenalty | None = None
    stop: Stop | None = None


# -- the policy: what lmsp cannot honour ----------------------------------------------------
@dataclass(frozen=True)
class ReadTools:
    """A body's ``tools`` and ``tool_choice`` as :mod:`lmsp.app.tooldefs` read them (in
    the Responses form, ``None`` where not given), checked: read once per create."""

    tools: list[dict[str, Any]] | None
    choice: Any


def _chat_logprobs(body: ChatCompletionCreate) -> Iterator[LmspError]:
    """Chat completions carry no log probabilities (``/v1/responses`` does)."""
    if body.logprobs:
        yield unsupported(
            "logprobs", "Log probabilities are given by /v1/responses (top_logprobs), not here."
        )
    if body.top_logprobs:
        yield unsupported(
            "top_logprobs", "Log probabilities are given by /v1/responses (top_logprobs), not here."
        )


def _first(problems: Iterator[LmspError]) -> None:
    for problem in problems:
        raise problem


def unavailable(body: BaseModel) -> Iterator[LmspError]:
    """The refusal of each :data:`Unavailable` field ``body`` sets, in declared order."""
    for name in _unavailable_fields(type(body)):
        if getattr(body, name) is not None:
            yield unsupported(name, f"{name} is not supported by this server.")


@functools.cache
def _unavailable_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The :data:`Unavailable` fields of a body's class, in declared order (looked up
    once a class, not a request)."""
    return tuple(
        name
        for name, field in model.model_fields.items()
        if any(isinstance(mark, _Unavailable) for mark in field.metadata)
    )


def _stream_options(body: CreateResponse | OpenAIBody) -> Iterator[LmspError]:
    """``stream_options`` goes with ``stream: true``; streams are not obfuscated here."""
    if body.stream_options is None:
        return
    if not body.stream:
        yield LmspError(
            "invalid_value", "stream_options needs stream: true.", param="stream_options"
        )
    if body.stream_options.include_obfuscation:
        yield unsupported("stream_options.include_obfuscation", "Streams are not obfuscated here.")


def check_response(body: CreateResponse) -> ReadTools:
    """Raise the first ``unsupported_parameter`` (or cross-field ``invalid_value``);
    the body's tools and ``tool_choice`` as read (:mod:`.tooldefs`, once) and checked
    with ``text.format`` (:mod:`.toolcheck`)."""
    _first(_response_head(body))
    read = ReadTools(
        tooldefs.request_tools(body.tools, body.input, tooldefs.RESPONSES),
        tooldefs.read_choice(body.tool_choice, tooldefs.RESPONSES),
    )
    fmt = body.text.format if body.text else None
    shown = None if fmt is None else fmt.model_dump(exclude_none=True, by_alias=True)
    _first(toolcheck.problems(read.tools or [], read.choice, shown, body.stop, mcp_tools=True))
    # ``text.verbosity`` is asked of the model in its system message (runner/plan.py)
    # ``reasoning`` is accepted: the models here do no reasoning at any effort, so a
    # response has no reasoning items and any summary asked for is empty (docs/clients.md)
    if body.service_tier not in TIERS:
        raise unsupported("service_tier", TIER_HELP)
    _first(_stream_options(body))
    return read


def _response_head(body: CreateResponse) -> Iterator[LmspError]:
    yield from unavailable(body)
    if body.background and body.store is False:
        yield LmspError(
            "invalid_value", "A background response must be stored (store: true).", param="store"
        )
    for value in body.include or []:
        if value not in INCLUDABLE:
            yield LmspError("invalid_value", f"Unknown include value {value!r}.", param="include")
        elif value not in (
            INCLUDE_LIFECYCLE,
            "reasoning.encrypted_content",
            "message.output_text.logprobs",
        ):
            yield unsupported("include", f"include {value!r}: lmsp has no such tool output.")


# -- Chat Completions -----------------------------------------------------------------------
class ImageUrl(Body):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class FileData(Body):
    file_data: str | None = None
    file_id: str | None = None
    filename: str | None = None


class ChatPart(Body):
    type: Literal["text", "image_url", "input_audio", "file", "refusal"]
    text: str | None = None
    image_url: ImageUrl | None = None
    input_audio: Any = None
    file: FileData | None = None
    refusal: str | None = None


class ChatFunctionCall(Body):
    name: ToolName
    arguments: str


class ChatToolCall(Body):
    id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    type: Literal["function"]
    function: ChatFunctionCall


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ChatPart] | None = None
    name: Annotated[str, StringConstraints(max_length=256)] | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    refusal: str | None = None
    function_call: Any = None
    audio: Any = None


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class ChatStreamOptions(Body):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


# -- the create bodies' shared fields --------------------------------------------------------
class Generation(Body):
    """The fields every translated create body shares (Chat Completions, Completions and
    Messages; each becomes a Responses create, :mod:`lmsp.protocol.request`)."""

    model: ModelId
    stream: bool | None = None
    top_p: TopP | None = None
    # LMSP extensions
    seed: Seed | None = None
    on_restart: OnRestart | None = None


class OpenAIBody(Generation):
    """The fields the Chat Completions and Completions bodies share."""

    max_tokens: OutputTokens | None = None
    temperature: Temperature | None = None
    stop: Stop | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = None
    stream_options: ChatStreamOptions | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, int] | None = None
    user: Annotated[str, StringConstraints(max_length=256)] | None = None


def _one_choice(body: OpenAIBody) -> Iterator[LmspError]:
    if body.n not in (None, 1):
        yield unsupported("n", "Only one choice per completion (n: 1) is supported.")


# -- Chat Completions -----------------------------------------------------------------------
class ChatCompletionCreate(OpenAIBody):
    """``POST /v1/chat/completions``: the whole create body."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: OutputTokens | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: Tools | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    metadata: Metadata | None = None
    store: bool | None = None
    safety_identifier: ShortId | None = None
    prompt_cache_key: ShortId | None = None
    service_tier: ServiceTier | None = None
    verbosity: Verbosity | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    # OpenAI features lmsp does not have
    audio: Unavailable = None
    prediction: Unavailable = None
    functions: Unavailable = None
    function_call: Unavailable = None
    web_search_options: Unavailable = None
    prompt_cache_retention: Unavailable = None
    prompt_cache_options: Unavailable = None
    moderation: Unavailable = None


def check_chat(body: ChatCompletionCreate) -> ReadTools:
    """Raise the first ``unsupported_parameter`` (or cross-field ``invalid_value``);
    the body's tools and ``tool_choice`` as read (in the Responses form, once) and
    checked."""
    _first(unavailable(body))
    _first(_one_choice(body))
    if (
        body.max_tokens is not None
        and body.max_completion_tokens is not None
        and body.max_tokens != body.max_completion_tokens
    ):
        raise LmspError(
            "invalid_value",
            "max_tokens and max_completion_tokens disagree; send one of them.",
            param="max_tokens",
        )
    fmt = body.response_format.model_dump(exclude_none=True) if body.response_format else None
    read = ReadTools(
        tooldefs.read_tools(body.tools, tooldefs.CHAT),
        tooldefs.read_choice(body.tool_choice, tooldefs.CHAT),
    )
    _first(
        toolcheck.problems(
            read.tools or [],
            read.choice,
            toolcheck.chat_format(fmt),
            body.stop,
            toolcheck.chat_param,
        )
    )
    _first(_chat_problems(body))
    return read


def _chat_problems(body: ChatCompletionCreate) -> Iterator[LmspError]:
    yield from _chat_logprobs(body)
    if body.logit_bias:
        yield unsupported("logit_bias", "logit_bias is not supported by this server.")
    if body.modalities is not None and "audio" in body.modalities:
        yield unsupported("modalities", "Only text output is supported.")
    if body.verbosity not in (None, "medium"):
        yield unsupported("verbosity", "Only the model's own verbosity (medium) is supported.")
    # ``reasoning_effort`` is accepted: the models here do no reasoning at any effort
    if body.service_tier not in TIERS:
        yield unsupported("service_tier", TIER_HELP)
    yield from _stream_options(body)
    for index, message in enumerate(body.messages):
        if message.name is not None:
            yield unsupported(
                f"messages.{index}.name", "Participant names are not supported by this server."
            )
        if message.function_call is not None or message.audio is not None:
            field = "function_call" if message.function_call is not None else "audio"
            yield unsupported(
                f"messages.{index}.{field}", f"{field} is not supported by this server."
            )


# -- legacy Completions -----------------------------------------------------------------------
#: what ``max_tokens`` is when a completion does not say (OpenAI's default for the endpoint)
COMPLETION_MAX_TOKENS = 16


class CompletionCreate(OpenAIBody):
    """``POST /v1/completions``: the whole create body."""

    #: one prompt as text (a list of one string is the same); checked by
    #: :func:`check_completion`, which names what it refuses
    prompt: Any
    # OpenAI features lmsp does not have: declared so that they are refused, not ignored
    echo: bool | None = None
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=20)] | None = None
    # LMSP extensions
    top_k: TopK | None = None
    min_p: MinP | None = None
    repeat_penalty: RepeatPenalty | None = None


def check_completion(body: CompletionCreate) -> str:
    """The prompt's text; raise the first ``unsupported_parameter`` (or ``invalid_value``)."""
    prompt = body.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    problems: list[LmspError] = []
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        problems.append(unsupported("prompt", "One prompt per request: send several requests."))
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (int, list)) for p in prompt):
        problems.append(unsupported("prompt", "Token arrays are not supported: send the text."))
    elif not isinstance(prompt, str) or not prompt:
        problems.append(LmspError("invalid_value", "prompt: a non-empty string.", param="prompt"))
    problems += _one_choice(body)
    if body.best_of not in (None, 1):
        problems.append(unsupported("best_of", "Only one candidate (best_of: 1) is supported."))
    if body.echo:
        problems.append(unsupported("echo", "The prompt is not echoed here."))
    if body.logprobs is not None:
        problems.append(
            unsupported("logprobs", "Log probabilities are given by /v1/responses, not here.")
        )
    if body.suffix:
        problems.append(unsupported("suffix", "Insertion (suffix) is not supported here."))
    if body.logit_bias:
        problems.append(unsupported("logit_bias", "logit_bias is not supported by this server."))
    problems += _stream_options(body)
    if problems:
        raise problems[0]
    assert isinstance(prompt, str)
    return prompt


# -- Embeddings -------------------------------------------------------------------------------
class EmbeddingCreate(Body):
    """``POST /v1/embeddings``: the whole body."""

    model: ModelId
    #: texts or token arrays, read by :func:`lmsp.protocol.embeddings.read_input`
    input: Any
    encoding_format: Literal["float", "base64"] | None = None
    #: the model's own length only (lmsp does not shorten embeddings)
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: Annotated[str, StringConstraints(max_length=256)] | None = None
