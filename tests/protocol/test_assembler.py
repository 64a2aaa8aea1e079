"""The output assembler: engine outputs → events and items, and its replay from a log."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from lmsp.protocol import events as ev
from lmsp.protocol.assembler import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    EngineOutput,
    OutputAssembler,
    TextDelta,
    items_from_events,
)


def counter() -> Callable[[str], str]:
    numbers = itertools.count()
    return lambda prefix: f"{prefix}_{next(numbers)}"


def run(outputs: list[EngineOutput], status: Any = "completed") -> tuple[list[dict[str, Any]], Any]:
    asm = OutputAssembler(counter())
    emitted = [e for out in outputs for e in asm.feed(out)]
    emitted += asm.finish(status)
    return emitted, asm


def test_text_gives_the_responses_event_order() -> None:
    emitted, asm = run([TextDelta("Hel"), TextDelta("lo")])
    assert [e["type"] for e in emitted] == [
        ev.OUTPUT_ITEM_ADDED,
        ev.CONTENT_PART_ADDED,
        ev.OUTPUT_TEXT_DELTA,
        ev.OUTPUT_TEXT_DELTA,
        ev.OUTPUT_TEXT_DONE,
        ev.CONTENT_PART_DONE,
        ev.OUTPUT_ITEM_DONE,
    ]
    added = emitted[0]["item"]
    assert added == {
        "type": "message",
        "id": "msg_0",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    assert emitted[4]["text"] == "Hello"
    assert emitted[-1]["item"]["status"] == "completed"
    assert asm.items == [emitted[-1]["item"]]
    assert asm.items[0]["content"][0] == {
        "type": "output_text",
        "text": "Hello",
        "annotations": [],
        "logprobs": [],
    }
    assert asm.text == "Hello"
    assert all(e["output_index"] == 0 for e in emitted)


def test_a_response_with_no_output_still_has_a_message() -> None:
    emitted, asm = run([])
    assert [e["type"] for e in emitted][:2] == [ev.OUTPUT_ITEM_ADDED, ev.CONTENT_PART_ADDED]
    assert asm.items[0]["content"][0]["text"] == ""
    assert asm.items[0]["status"] == "completed"


def test_a_token_limit_leaves_the_message_incomplete() -> None:
    emitted, asm = run([TextDelta("a")], status="incomplete")
    assert emitted[-1]["item"]["status"] == "incomplete"
    assert asm.items[0]["status"] == "incomplete"


def test_text_and_calls_become_separate_items() -> None:
    emitted, asm = run(
        [
            TextDelta("Let me look."),
            CallStart("get_weather", call_id="call_x"),
            ArgumentsDelta('{"city":'),
            ArgumentsDelta('"Oslo"}'),
            CallEnd(),
            TextDelta("Done."),
        ]
    )
    assert [i["type"] for i in asm.items] == ["message", "function_call", "message"]
    call = asm.items[1]
    assert call == {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_x",
        "name": "get_weather",
        "arguments": '{"city":"Oslo"}',
        "status": "completed",
    }
    kinds = [(e["type"], e["output_index"]) for e in emitted]
    assert (ev.OUTPUT_ITEM_DONE, 0) in kinds
    assert kinds.index((ev.OUTPUT_ITEM_DONE, 0)) < kinds.index((ev.OUTPUT_ITEM_ADDED, 1))
    deltas = [e["delta"] for e in emitted if e["type"] == ev.FUNCTION_CALL_ARGUMENTS_DELTA]
    done = next(e for e in emitted if e["type"] == ev.FUNCTION_CALL_ARGUMENTS_DONE)
    assert "".join(deltas) == done["arguments"] == call["arguments"]
    assert done["name"] == "get_weather"
    assert asm.text == "Let me look.Done."


def test_final_items_mark_open_items() -> None:
    asm = OutputAssembler(counter())
    asm.feed(TextDelta("partial"))
    assert asm.final_items("incomplete")[0]["status"] == "incomplete"
    assert asm.items[0]["status"] == "in_progress"  # the assembler itself is unchanged


def test_logprobs_ride_on_deltas_and_accumulate() -> None:
    entry = {"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}
    emitted, asm = run([TextDelta("a", (entry,))])
    delta = next(e for e in emitted if e["type"] == ev.OUTPUT_TEXT_DELTA)
    assert delta["logprobs"] == [entry]
    assert asm.items[0]["content"][0]["logprobs"] == [entry]


outputs = st.lists(
    st.one_of(
        st.builds(TextDelta, st.text(max_size=5)),
        st.tuples(st.sampled_from(["f", "g"]), st.lists(st.text(max_size=4), max_size=3)),
    ),
    max_size=12,
)


def flatten(spec: list[Any]) -> list[EngineOutput]:
    out: list[EngineOutput] = []
    for entry in spec:
        if isinstance(entry, TextDelta):
            out.append(entry)
        else:
            name, parts = entry
            out.append(CallStart(name))
            out.extend(ArgumentsDelta(p) for p in parts)
            out.append(CallEnd())
    return out


@given(outputs, st.integers(min_value=0, max_value=40))
def test_replaying_the_log_continues_exactly(spec: list[Any], cut: int) -> None:
    """A resumed task rebuilds its assembler from the log: the rest of its events and its
    final items are those of an uninterrupted run."""
    feed = flatten(spec)
    whole, whole_asm = run(feed)

    ids = counter()
    first = OutputAssembler(ids)
    cut = min(cut, len(feed))
    logged = [e for out in feed[:cut] for e in first.feed(out)]
    resumed = OutputAssembler.replay(logged, ids)
    assert resumed.items == first.items
    rest = [e for out in feed[cut:] for e in resumed.feed(out)] + resumed.finish()
    assert logged + rest == whole
    assert resumed.items == whole_asm.items
    assert items_from_events(whole) == whole_asm.items


# -- stop sequences ---------------------------------------------------------------------------
def text_of(emitted: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in emitted if e["type"] == ev.OUTPUT_TEXT_DELTA)


def test_a_stop_sequence_ends_the_text_before_it() -> None:
    asm = OutputAssembler(counter(), stop=["END"])
    emitted = [e for piece in ["one two E", "N", "D three"] for e in asm.feed(TextDelta(piece))]
    assert asm.stopped
    assert asm.feed(TextDelta("more")) == []  # nothing after the stop
    emitted += asm.finish()
    assert text_of(emitted) == "one two "
    assert emitted[-1]["item"]["content"][0]["text"] == "one two "
    # the held-back "E", "N" never reached a delta
    assert all("E" not in e["delta"] for e in emitted if e["type"] == ev.OUTPUT_TEXT_DELTA)


def test_text_held_for_a_stop_that_never_comes_is_released() -> None:
    asm = OutputAssembler(counter(), stop=["</end>", "STOP"])
    first = asm.feed(TextDelta("a </e"))
    assert text_of(first) == "a " and asm.held == "</e"
    second = asm.feed(TextDelta("x> b ST"))
    assert text_of(second) == "</ex> b " and asm.held == "ST"
    closing = asm.finish()
    assert text_of(closing) == "ST"
    assert asm.items[0]["content"][0]["text"] == "a </ex> b ST"
    assert not asm.stopped


def test_the_earliest_stop_sequence_wins() -> None:
    asm = OutputAssembler(counter(), stop=["cd", "b"])
    emitted = asm.feed(TextDelta("abcd")) + asm.finish()
    assert text_of(emitted) == "a"


def test_a_stop_at_the_start_leaves_an_empty_message() -> None:
    asm = OutputAssembler(counter(), stop=["Hi"])
    emitted = asm.feed(TextDelta("Hi there")) + asm.finish()
    assert asm.stopped
    assert [e["type"] for e in emitted][:2] == [ev.OUTPUT_ITEM_ADDED, ev.CONTENT_PART_ADDED]
    assert asm.items[0]["content"][0]["text"] == ""


@given(
    pieces=st.lists(st.sampled_from(["a", "b", "ab", "ba", "x", "abx", " "]), max_size=12),
    cut=st.integers(min_value=0, max_value=12),
)
def test_a_replay_with_the_held_text_continues_exactly(pieces: list[str], cut: int) -> None:
    """A resumed task rebuilds its assembler from the log plus the held text its snapshot
    kept, and then emits exactly what an uninterrupted one would."""
    stop = ["bab", "xx"]
    whole = OutputAssembler(counter(), stop=stop)
    expected = [e for p in pieces for e in whole.feed(TextDelta(p))] + whole.finish()
    cut = min(cut, len(pieces))
    first = OutputAssembler(counter(), stop=stop)
    logged = [e for p in pieces[:cut] for e in first.feed(TextDelta(p))]
    if first.stopped:
        return  # the task completed before the cut: nothing to resume
    again = OutputAssembler.replay(logged, counter(), stop=stop, held=first.held)
    rest = [e for p in pieces[cut:] for e in again.feed(TextDelta(p))] + again.finish()
    assert text_of(logged + rest) == text_of(expected)
    assert again.items[0]["content"][0]["text"] == whole.items[0]["content"][0]["text"]
