"""A plain response: one attempt of one turn (:mod:`lmsp.runner.attempt`), its prompt and
budget as its plan gives them (:func:`first_turn`). What :mod:`lmsp.runner.early` begins
while a create commits is that same first turn, so the attempt can adopt it."""

from __future__ import annotations

from lmsp.engines.base import EngineError, LoadedModel
from lmsp.protocol.request import PreparedRequest
from lmsp.runner import relax
from lmsp.runner.attempt import Attempt, TaskContext, room
from lmsp.runner.plan import Plan, plan_for, prompt_of
from lmsp.store import events
from lmsp.store import tasks as task_store
from lmsp.store.sql import Conn


def first_turn(plan: Plan, model: LoadedModel) -> list[int]:
    """The prompt of a plain response's turn on ``model``: refused (``EngineError``) when
    the context cannot hold it."""
    prompt = prompt_of(plan, model)
    if len(prompt) >= model.n_ctx:
        raise EngineError(
            "context_length_exceeded",
            f"The prompt has {len(prompt)} tokens; the context holds {model.n_ctx}.",
        )
    return prompt


def fresh_room(plan: Plan, model: LoadedModel, prompt: list[int]) -> int:
    """How many tokens a fresh task's turn may generate after ``prompt``."""
    return room(model.n_ctx, len(prompt), plan.max_output_tokens, 0)


def respond(
    task: TaskContext, conn: Conn, request: PreparedRequest, model: LoadedModel, resumed: bool
) -> None:
    """A plain response: one attempt of one turn, as its plan says (a resumed task goes
    on from its snapshot)."""
    snapshot = (task_store.snapshot(conn, task.id) if resumed else None) or {}
    tokens: list[int] = list(snapshot.get("tokens", []))
    plan = plan_for(request)
    # the output so far is what the log holds: the snapshot covers exactly that
    assembler = (
        plan.replay(events.output_events(conn, task.id), snapshot.get("held", ""))
        if tokens
        else plan.assembler()
    )
    attempt = Attempt(task, model, plan.sampling, assembler, tokens)

    def turn() -> str | None:
        prompt = first_turn(plan, model)
        attempt.input_tokens = len(prompt)
        left = attempt.room(prompt, tokens, plan.max_output_tokens)
        return attempt.generate(prompt, tokens, plan.grammar, left)

    # keywords the grammar could not enforce are checked in the output
    attempt.conclude(turn, check=lambda output: relax.check_calls(output, plan.functions))
