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

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lmsp.constraints import grammar
from lmsp.engines.base import Sampling
from lmsp.protocol import completions, items, objects
from lmsp.protocol.assembler import Event, OutputAssembler
from lmsp.protocol.toolcalls import CallAssembler
from lmsp.runner import relax

#: the ``include`` value that asks for log probabilities in the output
LOGPROBS = "message.output_text.logprobs"
Item = dict[str, Any]


def full_context_of(request: dict[str, Any]) -> list[Item]:
    """Every item of a stored request's context: the conversation it continues
    (``previous_response_id``, resolved when it was created) and then its own input."""
    return [*(request.get(items.HISTORY) or []), *items.input_of(request)]


def context_of(request: dict[str, Any]) -> list[Item]:
    """The items a stored request gives the model: its whole context but the oldest
    items ``truncation: "auto"`` dropped when it was created (:func:`truncate`). Its
    ``kept`` newest items, which is all a runner reads of a long history
    (:func:`lmsp.store.responses.given_request`); by the count dropped in a record from
    before ``kept``."""
    recorded = request.get(items.TRUNCATED) or {}
    context = full_context_of(request)
    if "kept" in recorded:
        return context[max(0, len(context) - int(recorded["kept"])) :]
    return context[int(recorded.get("items", 0)) :]


def truncate(
    request: dict[str, Any], dropped: int, *, unread: int = 0, oldest: Item | None = None
) -> None:
    """Record in ``request`` that the ``dropped`` oldest items of the context it holds
    are left out (``truncation: "auto"``), after ``unread`` older ones its history had
    (only counted, never read: the oldest of all is ``oldest``): how many in all, the
    first and the last of them (id, type and role; the items between are the context's,
    in order), and how many are ``kept`` (internal: what a runner reads). Never the whole
    list: a long conversation drops more with every turn, and the record is copied into
    the response object of every lifecycle event (that list once made an 18-turn
    chain's events quadratic in its length)."""
    if dropped + unread <= 0:
        request.pop(items.TRUNCATED, None)
        return
    context = full_context_of(request)
    first = oldest if unread and oldest is not None else context[0]
    request[items.TRUNCATED] = {
        "items": unread + dropped,
        "first": _brief(first),
        "last": _brief(context[dropped - 1]),
        "kept": len(context) - dropped,
    }


def _brief(item: Item) -> dict[str, Any]:
    return {"id": item.get("id"), "type": item.get("type"), "role": item.get("role")}


#: ``text.verbosity`` other than ``medium`` (the model's own), as the model is asked it
VERBOSITY = {"low": "Answer concisely.", "high": "Answer thoroughly, with detail."}


def messages_of(request: dict[str, Any], context: list[Item] | None = None) -> list[dict[str, str]]:
    """The chat messages of a stored request: ``instructions`` first, as the system
    message (a conversation's earlier instructions are not carried over), then every
    item of its context (``context``: these items instead). A text completion's prompt
    is one raw-prompt message, which the engine gives the model without the chat
    template (:mod:`lmsp.protocol.completions`)."""
    if request.get(completions.RAW):
        (prompt,) = items.input_of(request)
        return completions.raw_messages("".join(part["text"] for part in prompt["content"]))
    instructions = request.get("instructions")
    hint = VERBOSITY.get(str((request.get("text") or {}).get("verbosity")))
    if hint:  # ``text.verbosity``: asked of the model in its system message
        instructions = f"{instructions}\n\n{hint}" if instructions else hint
    return items.render(context_of(request) if context is None else context, instructions)


def sampling_of(request: dict[str, Any]) -> Sampling:
    """The sampling values of a stored request: the numbers fixed when it was created
    (the request's own, else the model's defaults, else lmsp's; see
    :func:`lmsp.protocol.objects.sampling_used`), lmsp's defaults for rows from before."""
    used = objects.sampling_used(request)
    include = request.get("include") or ()
    return Sampling(
        temperature=float(used["temperature"]),
        top_p=float(used["top_p"]),
        seed=int(request["seed"]),
        top_k=int(used["top_k"]),
        min_p=float(used["min_p"]),
        presence_penalty=float(used["presence_penalty"]),
        frequency_penalty=float(used["frequency_penalty"]),
        repeat_penalty=float(used["repeat_penalty"]),
        top_logprobs=int(used["top_logprobs"]),
        logprobs=int(used["top_logprobs"]) > 0 or LOGPROBS in include,
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
    #: function definitions the prompt shows (``{name, description, parameters}``)
    tools: list[dict[str, Any]] = field(default_factory=list)
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
            tool["name"]: tool["namespace"] for tool in self.tools if tool.get("namespace")
        }
        if isinstance(assembler, CallAssembler):
            assembler.callable = frozenset(self.callable)
        return assembler


def offers_none(request: dict[str, Any]) -> bool:
    """Does ``tool_choice`` offer no tool at all (``"none"``, or ``allowed_tools`` in
    mode ``"none"``)? Then the model is not told of any, and nothing it writes is a
    call."""
    choice = request.get("tool_choice")
    if choice == "none":
        return True
    return (
        isinstance(choice, dict)
        and choice.get("type") == "allowed_tools"
        and choice.get("mode") == "none"
    )


def tools_of(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The function tools the prompt shows: all of them unless ``tool_choice`` offers
    none (:func:`offers_none`)."""
    if offers_none(request):
        return []
    return [tool for tool in request.get("tools") or [] if tool.get("type") == "function"]


def text_schema(request: dict[str, Any]) -> dict[str, Any] | None:
    """The schema the output text must match (``text.format``), if any."""
    fmt = (request.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        schema: dict[str, Any] = fmt.get("schema") or {}
        return schema
    if fmt.get("type") == "json_object":
        return dict(grammar.ANY_OBJECT)
    return None


def callable_tools(request: dict[str, Any]) -> tuple[list[grammar.Function], bool]:
    """The functions the model may call under ``tool_choice``, and whether it must."""
    tools = tools_of(request)
    choice = request.get("tool_choice") or "auto"
    required = choice == "required"
    if isinstance(choice, dict):
        if choice.get("type") == "function":
            tools, required = [t for t in tools if t["name"] == choice.get("name")], True
        elif choice.get("type") == "allowed_tools":
            names = {t.get("name") for t in choice.get("tools") or []}
            tools = [t for t in tools if t["name"] in names]
            required = choice.get("mode") == "required"
    functions = [
        grammar.Function(
            t["name"],
            t.get(relax.ENFORCED, t.get("parameters")) or {"type": "object", "properties": {}},
        )
        for t in tools
    ]
    return functions, required


def call_limit(request: dict[str, Any]) -> int | None:
    """How many calls one response may make (``parallel_tool_calls``, ``max_tool_calls``)."""
    limit = request.get("max_tool_calls")
    if request.get("parallel_tool_calls") is False:
        return 1
    return None if limit is None else int(limit)


def grammar_of(request: dict[str, Any]) -> tuple[str | None, bool]:
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


def plan_for(request: dict[str, Any]) -> Plan:
    """The plan of a stored request."""
    limit = request.get("max_output_tokens")
    text_grammar, calls = grammar_of(request)
    functions, _ = callable_tools(request)
    return Plan(
        messages=messages_of(request),
        sampling=sampling_of(request),
        stop=tuple(request.get("stop") or ()),
        max_output_tokens=None if limit is None else int(limit),
        grammar=text_grammar,
        tools=tools_of(request),
        calls=calls,
        callable=tuple(f.name for f in functions) if calls else (),
    )
