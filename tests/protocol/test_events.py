"""Event names: one source of truth for lifecycle and terminal events."""

from __future__ import annotations

from typing import Any

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


def test_coalesce_joins_each_run_of_one_items_deltas_and_nothing_else() -> None:
    def text(item: str, part: int, delta: str, lp: list[str]) -> dict[str, Any]:
        entries = [{"token": t} for t in lp]
        return {
            "type": ev.OUTPUT_TEXT_DELTA,
            "item_id": item,
            "output_index": 0,
            "content_index": part,
            "delta": delta,
            "logprobs": entries,
        }

    def args(item: str, delta: str) -> dict[str, Any]:
        return {"type": ev.FUNCTION_CALL_ARGUMENTS_DELTA, "item_id": item, "delta": delta}

    added = {"type": "response.output_item.added", "item": {"id": "fc_1"}}
    batch = [
        text("msg_1", 0, "Hel", ["Hel"]),
        text("msg_1", 0, "lo", ["lo"]),
        text("msg_1", 1, " there", [" there"]),  # another content part
        added,
        args("fc_1", '{"a"'),
        args("fc_1", ": 1}"),
        text("msg_1", 1, "!", ["!"]),  # after another event: not joined across it
    ]
    before = [dict(e) for e in batch]
    out = ev.coalesce(batch)
    assert batch == before  # the input is left as it was
    assert [e.get("delta") for e in out] == ["Hello", " there", None, '{"a": 1}', "!"]
    assert [t["token"] for t in out[0]["logprobs"]] == ["Hel", "lo"]
    assert out[3] == args("fc_1", '{"a": 1}')
    assert out[2] is added
    assert ev.coalesce([]) == []
