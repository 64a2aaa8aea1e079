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

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from lmsp.engines.base import Constraint, LoadedModel, Sampling
from lmsp.protocol.assembler import Event, OutputAssembler

#: builds a fresh constraint for one sequence of a loaded model (and again on resume,
#: where it is then fed the snapshot's tokens)
ConstraintFactory = Callable[[LoadedModel], Constraint]


def messages_of(request: dict[str, Any]) -> list[dict[str, str]]:
    """The chat messages of a stored request: ``instructions`` first, as the system message."""
    out: list[dict[str, str]] = []
    if request.get("instructions"):
        out.append({"role": "system", "content": str(request["instructions"])})
    given = request["input"]
    if isinstance(given, str):
        out.append({"role": "user", "content": given})
        return out
    for message in given:
        content = message["content"]
        if not isinstance(content, str):
            content = "".join(part.get("text", "") for part in content)
        role = "system" if message["role"] == "developer" else message["role"]
        out.append({"role": role, "content": content})
    return out


def sampling_of(request: dict[str, Any]) -> Sampling:
    """The sampling values a request asked for, lmsp's defaults for the rest."""
    temperature, top_p = request.get("temperature"), request.get("top_p")
    return Sampling(
        temperature=1.0 if temperature is None else float(temperature),
        top_p=1.0 if top_p is None else float(top_p),
        seed=int(request["seed"]),
    )


@dataclass(frozen=True)
class Plan:
    messages: list[dict[str, str]]
    sampling: Sampling
    stop: tuple[str, ...] = ()
    max_output_tokens: int | None = None
    constraint: ConstraintFactory | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def assembler(self) -> OutputAssembler:
        """A fresh assembler for this task's output."""
        return OutputAssembler(stop=self.stop)

    def replay(self, logged: Iterable[Event], held: str) -> OutputAssembler:
        """The assembler as it was after ``logged`` (a resumed task)."""
        return OutputAssembler.replay(logged, stop=self.stop, held=held)


def plan_for(request: dict[str, Any]) -> Plan:
    """The plan of a stored request."""
    limit = request.get("max_output_tokens")
    return Plan(
        messages=messages_of(request),
        sampling=sampling_of(request),
        stop=tuple(request.get("stop") or ()),
        max_output_tokens=None if limit is None else int(limit),
    )
