from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lmsp.protocol.states import (
    TERMINAL,
    UNFINISHED,
    Policy,
    Status,
    allowed,
    cancel_target,
    recovery_target,
    response_status,
)

# PROTOCOL.md section 5, written out by hand: (from, to)
SPEC_EDGES = {
    (Status.QUEUED, Status.LOADING),
    (Status.LOADING, Status.RUNNING),
    (Status.RUNNING, Status.COMPLETED),
    (Status.RUNNING, Status.FAILED),
    (Status.LOADING, Status.FAILED),
    (Status.QUEUED, Status.FAILED),  # recovery with on_restart=fail
    (Status.QUEUED, Status.CANCELLED),
    (Status.LOADING, Status.CANCELLING),
    (Status.RUNNING, Status.CANCELLING),
    (Status.CANCELLING, Status.CANCELLED),
    (Status.LOADING, Status.QUEUED),  # recovery: retry / resume of loading
    (Status.RUNNING, Status.QUEUED),  # recovery: retry
}


def test_exactly_the_spec_transitions_exist() -> None:
    edges = {(a, b) for a, b in itertools.product(Status, Status) if allowed(a, b)}
    assert edges == SPEC_EDGES


def test_terminal_states_never_change() -> None:
    for state, target in itertools.product(TERMINAL, Status):
        assert not allowed(state, target)


@given(st.lists(st.sampled_from(list(Status)), max_size=30))
def test_any_walk_stops_changing_at_a_terminal_state(targets: list[Status]) -> None:
    current = Status.QUEUED
    seen_terminal: Status | None = None
    for target in targets:
        if allowed(current, target):
            assert seen_terminal is None
            current = target
        if current in TERMINAL:
            seen_terminal = current
    assert seen_terminal in (None, current)


@pytest.mark.parametrize(
    ("found", "policy", "expected"),
    [
        (Status.QUEUED, Policy.FAIL, Status.FAILED),
        (Status.QUEUED, Policy.RETRY, Status.QUEUED),
        (Status.QUEUED, Policy.RESUME, Status.QUEUED),
        (Status.LOADING, Policy.FAIL, Status.FAILED),
        (Status.LOADING, Policy.RETRY, Status.QUEUED),
        (Status.LOADING, Policy.RESUME, Status.QUEUED),
        (Status.RUNNING, Policy.FAIL, Status.FAILED),
        (Status.RUNNING, Policy.RETRY, Status.QUEUED),
        (Status.RUNNING, Policy.RESUME, Status.RUNNING),
        (Status.CANCELLING, Policy.FAIL, Status.CANCELLED),
        (Status.CANCELLING, Policy.RETRY, Status.CANCELLED),
        (Status.CANCELLING, Policy.RESUME, Status.CANCELLED),
    ],
)
def test_recovery_table_of_chapter_11_3(found: Status, policy: Policy, expected: Status) -> None:
    assert recovery_target(found, policy) is expected
    if expected is not found:
        assert allowed(found, expected)


def test_cancel_targets() -> None:
    assert cancel_target(Status.QUEUED) is Status.CANCELLED
    assert cancel_target(Status.LOADING) is Status.CANCELLING
    assert cancel_target(Status.RUNNING) is Status.CANCELLING
    for state in (Status.CANCELLING, *TERMINAL):
        assert cancel_target(state) is None


def test_response_status_mapping() -> None:
    assert response_status(Status.QUEUED) == "queued"
    for state in (Status.LOADING, Status.RUNNING, Status.CANCELLING):
        assert response_status(state) == "in_progress"
    assert response_status(Status.COMPLETED) == "completed"
    assert response_status(Status.COMPLETED, incomplete=True) == "incomplete"
    assert response_status(Status.FAILED) == "failed"
    assert response_status(Status.CANCELLED) == "cancelled"
    assert set(Status) == UNFINISHED | TERMINAL
