"""Event names: one source of truth for lifecycle and terminal events."""

from __future__ import annotations

from lmsp.protocol import events as ev
from lmsp.protocol.states import TERMINAL, Status


def test_every_state_has_its_lifecycle_event() -> None:
    assert set(ev.LIFECYCLE) == set(Status)
    assert {ev.LIFECYCLE[s] for s in TERMINAL} | {ev.INCOMPLETE} == ev.TERMINAL


def test_terminal_event_for_a_finished_task() -> None:
    assert ev.terminal_for(Status.COMPLETED) == ev.COMPLETED
    assert ev.terminal_for(Status.COMPLETED, incomplete=True) == ev.INCOMPLETE
    assert ev.terminal_for(Status.CANCELLED) == ev.CANCELLED
    assert ev.terminal_for(Status.FAILED) == ev.FAILED


def test_lmsp_extensions_are_lifecycle_only() -> None:
    assert {ev.LOADING, ev.CANCELLING} == ev.LMSP_LIFECYCLE
    assert not ev.LMSP_LIFECYCLE & ev.TERMINAL
    assert not ev.LMSP_LIFECYCLE & ev.OUTPUT


def test_lifecycle_events_carry_the_response() -> None:
    event = ev.lifecycle(ev.QUEUED, {"id": "resp_1"}, attempt=2)
    assert event == {"type": ev.QUEUED, "attempt": 2, "response": {"id": "resp_1"}}
