"""What one task asks of the engine, read from its stored request: the chat messages,
the sampling values, stop sequences, the output budget and (for tools and structured
output) the constraint and the assembler that interprets what is generated.

This is the seam between the request side (input items, conversations, tools,
structured output) and the generation side (the runner and the engine session): the
runner builds a :class:`Plan` for each task and uses nothing else from the request.
A plan is a pure function of the stored request and the model record, so a resumed
task gets exactly the plan it started with.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from lmsp.constraints import grammar
from lmsp.engines.base import LoadedModel, Sampling
from lmsp.protocol import completions, items
from lmsp.protocol import tools as tooltypes
from lmsp.protocol.assembler import Event, OutputAssembler
from lmsp.protocol.itemtypes import InputItem, InputText, Message, plain
from lmsp.protocol.request import (
    Brief,
    PreparedRequest,
    RequestFields,
    Truncated,
    sampling_used,
)
from lmsp.protocol.toolcalls import CallAssembler
from lmsp.protocol.tools import AllowedTools, FunctionChoice, FunctionTool
from lmsp.store.responses import tier_of

#: the ``include`` value that asks for log probabilities in the output
LOGPROBS = "message.output_text.logprobs"


def full_context_of(request: PreparedRequest) -> list[InputItem]:
    """Every item of a stored request's context: the conversation it continues
    (``previous_response_id``, resolved when it was created) and then its own input."""
    return [*(request.history or ()), *request.input]


def context_of(request: PreparedRequest) -> list[InputItem]:
    """The items a stored request gives the model: its whole context but the oldest
    items ``truncation: "auto"`` dropped when it was created (:func:`truncate`). Its
    ``kept`` newest items, which is all a runner reads of a long history
    (:func:`lmsp.store.responses.given_request`); by the count dropped in a record from
    before ``kept``."""
    recorded = request.truncated
    context = full_context_of(request)
    if recorded is None:
        return context
    if recorded.kept is not None:
        return context[max(0, len(context) - recorded.kept) :]
    return context[recorded.items :]


def truncate(
    request: PreparedRequest, dropped: int, *, unread: int = 0, oldest: InputItem | None = None
) -> PreparedRequest:
    """``request`` with the record that the ``dropped`` oldest items of the context it
    holds are left out (``truncation: "auto"``), after ``unread`` older ones its history
    had (only counted, never read: the oldest of all is ``oldest``): how many in all,
    the first and the last of them (id, type and role; the items between are the
    context's, in order), and how many are ``kept`` (internal: what a runner reads).
    Never the whole list: a long conversation drops more with every turn, and the record
    is copied into the response object of every lifecycle event (that list once made an
    18-turn chain's events quadratic in its length)."""
    if dropped + unread <= 0:
        return msgspec.structs.replace(request, truncated=None)
    context = full_context_of(request)
    first = oldest if unread and oldest is not None else context[0]
    record = Truncated(
        items=unread + dropped,
        first=brief(first),
        last=brief(context[dropped - 1]),
        kept=len(context) - dropped,
    )
    return msgspec.structs.replace(request, truncated=record)


def brief(item: InputItem) -> Brief:
    """An item as a record names it."""
    return Brief(item.id, item.type, item.role if isinstance(item, Message) else None)


#: ``text.verbosity`` other than ``medium`` (the model's own), as the model is asked it
VERBOSITY = {"low": "Answer concisely.", "high": "Answer thoroughly, with detail."}


def messages_of(
    request: RequestFields, context: Sequence[InputItem] | None = None
) -> list[dict[str, str]]:
    """The chat messages of a request: ``instructions`` first, as the system message (a
    conversation's earlier instructions are not carried over), then every item of its
    context (``context``: these items instead). A text completion's prompt is one
    raw-prompt message, which the engine gives the model without the chat template
    (:mod:`lmsp.protocol.completions`)."""
    if request.raw_prompt and isinstance(request, PreparedRequest):
        (prompt,) = request.input
        assert isinstance(prompt, Message)
        text = "".join(part.text for part in prompt.content if isinstance(part, InputText))
        return completions.raw_messages(text)
    instructions = request.instructions
    verbosity = request.text.verbosity if request.text is not None else None
    hint = VERBOSITY.get(str(verbosity))
    if hint:  # ``text.verbosity``: asked of the model in its system message
        instructions = f"{instructions}\n\n{hint}" if instructions else hint
    if context is None:
        assert isinstance(request, PreparedRequest)
        context = context_of(request)
    return items.render(context, instructions)


def sampling_of(request: PreparedRequest) -> Sampling:
    """The sampling values of a stored request: the numbers fixed when it was created
    (the request's own, else the model's defaults, else lmsp's; see
    :func:`lmsp.protocol.request.sampling_used`), lmsp's defaults for rows from before."""
    used = sampling_used(request)
    include = request.include or ()
    return Sampling(
        temperature=float(used["temperature"]),
        top_p=float(used["top_p"]),
        seed=int(request.seed or 0),
        top_k=int(used["top_k"]),
        min_p=float(used["min_p"]),
        presence_penalty=float(used["presence_penalty"]),
        frequency_penalty=float(used["frequency_penalty"]),
        repeat_penalty=float(used["repeat_penalty"]),
        top_logprobs=int(used["top_logprobs"]),
        logprobs=int(used["top_logprobs"]) > 0 or LOGPROBS in include,
        tier=tier_of(request),
    )


@dataclass(frozen=True)
class Plan:
    messages: list[dict[str, str]]
    sampling: Sampling
    stop: tuple[str, ...] = ()
    max_output_tokens: int | None = None
    #: the grammar the output is held to (llguidance's; the engine compiles it and feeds
    #: a resumed task's snapshot to it), ``None`` for free text
    grammar: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: function definitions the prompt shows (the engine's: ``{name, description,
    #: parameters, …}``)
    tools: list[dict[str, Any]] = field(default_factory=list)
    #: the function tools the prompt shows
    functions: tuple[FunctionTool, ...] = ()
    #: the output may contain ``<tool_call>`` segments (read as function calls)
    calls: bool = False
    #: the functions the grammar lets the model call: a call of any other stays text
    callable: tuple[str, ...] = ()

    def assembler(self) -> OutputAssembler:
        """A fresh assembler for this task's output."""
        if self.calls:
            return self._named(CallAssembler())
        return OutputAssembler(stop=self.stop)

    def replay(self, logged: Iterable[Event], held: str) -> OutputAssembler:
        """The assembler as it was after ``logged`` (a resumed task)."""
        if self.calls:
            return self._named(CallAssembler.replay(logged, held=held))
        return OutputAssembler.replay(logged, stop=self.stop, held=held)

    def _named(self, assembler: OutputAssembler) -> OutputAssembler:
        assembler.namespaces = {
            tool.name: tool.namespace for tool in self.functions if tool.namespace
        }
        if isinstance(assembler, CallAssembler):
            assembler.callable = frozenset(self.callable)
        return assembler


def offers_none(request: RequestFields) -> bool:
    """Does ``tool_choice`` offer no tool at all (``"none"``, or ``allowed_tools`` in
    mode ``"none"``)? Then the model is not told of any, and nothing it writes is a
    call."""
    return tooltypes.offers_none(request.tool_choice)


def functions_of(request: RequestFields) -> list[FunctionTool]:
    """The function tools the prompt shows: all of them unless ``tool_choice`` offers
    none (:func:`offers_none`)."""
    if offers_none(request):
        return []
    return tooltypes.function_tools(request.tools)


def tools_of(request: RequestFields) -> list[dict[str, Any]]:
    """The function definitions the prompt shows (what an engine is given)."""
    return [plain(tool) for tool in functions_of(request)]


def text_schema(request: RequestFields) -> dict[str, Any] | None:
    """The schema the output text must match (``text.format``), if any."""
    fmt = request.text.format if request.text is not None else None
    if fmt is None:
        return None
    if fmt.type == "json_schema":
        return fmt.schema or {}
    if fmt.type == "json_object":
        return dict(grammar.ANY_OBJECT)
    return None


def callable_tools(request: RequestFields) -> tuple[list[grammar.Function], bool]:
    """The functions the model may call under ``tool_choice``, and whether it must."""
    tools = functions_of(request)
    choice = request.tool_choice or "auto"
    required = choice == "required"
    if isinstance(choice, FunctionChoice):
        tools, required = [t for t in tools if t.name == choice.name], True
    elif isinstance(choice, AllowedTools):
        names = {t.name for t in choice.tools}
        tools = [t for t in tools if t.name in names]
        required = choice.mode == "required"
    functions = [grammar.Function(t.name, t.grammar_schema()) for t in tools]
    return functions, required


def call_limit(request: RequestFields) -> int | None:
    """How many calls one response may make (``parallel_tool_calls``, ``max_tool_calls``)."""
    if request.parallel_tool_calls is False:
        return 1
    return request.max_tool_calls


def grammar_of(request: RequestFields) -> tuple[str | None, bool]:
    """The grammar the output is held to (``None``: free text) and whether it may hold
    tool calls."""
    schema = text_schema(request)
    functions, required = callable_tools(request)
    if functions:
        limit = call_limit(request)
        return (
            grammar.calls_grammar(functions, required=required, limit=limit, text_schema=schema),
            True,
        )
    if schema is not None:
        return grammar.json_grammar(schema), False
    return None, False


def prompt_of(plan: Plan, model: LoadedModel) -> list[int]:
    """The prompt tokens of a plain turn of ``plan`` (its tools rendered, if any)."""
    if plan.tools:
        return model.prompt_tokens(plan.messages, plan.tools)
    return model.prompt_tokens(plan.messages)


def plan_for(request: PreparedRequest) -> Plan:
    """The plan of a stored request."""
    text_grammar, calls = grammar_of(request)
    functions, _ = callable_tools(request)
    shown = functions_of(request)
    return Plan(
        messages=messages_of(request),
        sampling=sampling_of(request),
        stop=request.stop or (),
        max_output_tokens=request.max_output_tokens,
        grammar=text_grammar,
        tools=[plain(tool) for tool in shown],
        functions=tuple(shown),
        calls=calls,
        callable=tuple(f.name for f in functions) if calls else (),
    )
