"""The task state machine of PROTOCOL.md section 5 — pure, no I/O.

``queued → loading → running → completed | failed``; a cancel takes ``queued`` straight
to ``cancelled`` and ``loading | running`` through ``cancelling`` to ``cancelled``.
Recovery may put ``loading``/``running`` back to ``queued`` (retry, resume) and fail
any unfinished task. Nothing else exists; a terminal state never changes.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    QUEUED = "queued"
    LOADING = "loading"
    RUNNING = "running"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


class Policy(StrEnum):
    FAIL = "fail"
    RETRY = "retry"
    RESUME = "resume"


TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
UNFINISHED = frozenset(set(Status) - TERMINAL)

#: Every allowed transition: target → the states it may come from.
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.LOADING: frozenset({Status.QUEUED}),
    Status.RUNNING: frozenset({Status.LOADING}),
    Status.COMPLETED: frozenset({Status.RUNNING}),
    # a running/loading task fails on engine errors; recovery fails any unfinished one
    Status.FAILED: frozenset({Status.QUEUED, Status.LOADING, Status.RUNNING}),
    Status.CANCELLING: frozenset({Status.LOADING, Status.RUNNING}),
    Status.CANCELLED: frozenset({Status.QUEUED, Status.CANCELLING}),
    # recovery only: retry/resume put a task back in the queue
    Status.QUEUED: frozenset({Status.LOADING, Status.RUNNING}),
}


def sources(target: Status) -> frozenset[Status]:
    """The states a task may be in for a move to ``target``."""
    return TRANSITIONS.get(target, frozenset())


def allowed(current: Status, target: Status) -> bool:
    return current in sources(target)


def cancel_target(current: Status) -> Status | None:
    """Where a cancel request moves a task, or ``None`` when it changes nothing."""
    if current is Status.QUEUED:
        return Status.CANCELLED
    if current in (Status.LOADING, Status.RUNNING):
        return Status.CANCELLING
    return None


def recovery_target(current: Status, policy: Policy) -> Status:
    """The table of chapter 11.3: where a leftover task goes at startup."""
    if current is Status.CANCELLING:
        return Status.CANCELLED
    if policy is Policy.FAIL:
        return Status.FAILED
    if current is Status.RUNNING and policy is Policy.RESUME:
        return Status.RUNNING
    if current in (Status.QUEUED, Status.LOADING, Status.RUNNING):
        return Status.QUEUED
    raise ValueError(f"{current} is not a leftover state")


def response_status(task_status: Status, incomplete: bool = False) -> str:
    """The response's ``status`` for a task's status (PROTOCOL.md section 4)."""
    if task_status in (Status.LOADING, Status.RUNNING, Status.CANCELLING):
        return "in_progress"
    if task_status is Status.COMPLETED and incomplete:
        return "incomplete"
    return task_status.value


def sql_list(states: frozenset[Status] | tuple[Status, ...]) -> str:
    """``'a','b'`` for an SQL ``IN (…)`` over states (the values are this enum's own)."""
    return ",".join(f"'{s.value}'" for s in sorted(states))


#: SQL list of the finished states, for guarded deletes and queries
FINISHED_SQL = sql_list(TERMINAL)
#: SQL list of the unfinished states
UNFINISHED_SQL = sql_list(UNFINISHED)
