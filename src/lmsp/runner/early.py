"""A create's first turn, begun while the writer commits the create.

A create that finds a regular worker waiting hands it the claim that rides in the
create's own commit (:mod:`lmsp.runner.idlers`), and with it the request as prepared
(:class:`FirstTurn`). The worker, idle until that commit is answered, begins the turn's
generation in the model's engine at once (:func:`begin`): the plan, prompt and budget
the attempt will compute from the stored request (:func:`lmsp.runner.plan.plan_for`, a
pure function of it; :func:`lmsp.runner.plain.first_turn`), so that the engine, a remote
upstream's request above all, starts a commit's time sooner. If the claim took that very
task (:func:`claimed`), its attempt asks the engine for the same inputs and is given
that generation (:mod:`lmsp.engines.early`). It is settled at the attempt's first
generation: adopted, or — inputs that came out different — cancelled in the engine; and
at once when the claim took another task, the create was a replay or its commit failed.
Nothing of it is written before the task is committed: its tokens are logged by the
attempt, as its own are.

Begun for a plain response whose model's engine is up (not for the MCP loop, whose
turns alternate with tool calls). A turn that continues a history (a previous response,
a conversation) is begun from the history the create's length check read: the same
items the runner reads back, so the same prompt.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lmsp.protocol.records import TaskRecord
from lmsp.protocol.request import PreparedRequest
from lmsp.runner import mcp_loop, plain
from lmsp.runner.plan import plan_for
from lmsp.store.models import ModelRecord
from lmsp.store.responses import Created

if TYPE_CHECKING:
    from lmsp.engines.host import ModelHost

log = logging.getLogger(__name__)

#: closes a generation begun early unless an attempt adopted it (``True``: closed)
Drop = Callable[[], bool]


@dataclass(frozen=True)
class FirstTurn:
    """What a create hands the worker its claim is for."""

    request: PreparedRequest
    record: ModelRecord  # the model it runs (an alias resolved)
    created: concurrent.futures.Future[Created]  # the create's write


def begin(first: FirstTurn, host: ModelHost) -> Drop | None:
    """Begin ``first``'s generation if it can be begun as its attempt will ask for it:
    what closes it if no attempt adopts it, else ``None``. Never raises: a failure
    here is met again, and handled, by the attempt."""
    request = first.request
    if mcp_loop.applies(request):  # its turns alternate with calls: the loop's own
        return None
    engine = host.ready(first.record)
    if engine is None:
        return None
    try:
        plan = plan_for(request)
        prompt = plain.first_turn(plan, engine)
        left = plain.fresh_room(plan, engine, prompt)
        if left <= 0:
            return None
        return engine.begin_early(prompt, plan.sampling, plan.grammar, left)
    except Exception as exc:  # e.g. its engine died meanwhile
        log.debug("a first turn was not begun early: %s", exc)
        return None


def claimed(first: FirstTurn, taken: tuple[TaskRecord, bool] | None) -> bool:
    """Did the claim that rode in ``first``'s commit take its task?"""
    done = first.created
    if taken is None or not done.done() or done.cancelled() or done.exception() is not None:
        return False
    created = done.result()
    return not created.replayed and created.task_id == taken[0].id
