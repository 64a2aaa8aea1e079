"""A log event's SSE frame is written without sse-starlette's per-line scan, and the
events of one read of the log go out as one write: the bytes are the same frames."""

from __future__ import annotations

from sse_starlette import ServerSentEvent

from lmsp.api.sse import SEP, Batch, Stored, as_stored, sse
from lmsp.protocol.events import TERMINAL


def test_a_stored_event_is_framed_as_sse_starlette_frames_it() -> None:
    for seq, kind, data in [
        (0, "response.created", '{"type":"response.created","sequence_number":0}'),
        (7, "response.output_text.delta", '{"delta":"olá 雪 🙂 \\n\\u2028"}'),
        (9, "odd", "not compact\nJSON\r\nat all"),  # line breaks: line by line
    ]:
        expected = ServerSentEvent(data, event=kind, id=str(seq), sep=SEP).encode()
        assert Stored(seq, kind, data).encode() == expected
        assert [e.encode() for e in as_stored(seq, kind, data)] == [expected]


def test_a_batch_is_its_events_back_to_back_and_names_the_terminal_one() -> None:
    events = [
        as_stored(1, "response.output_text.done", "{}")[0],
        as_stored(2, "response.completed", "{}")[0],
        sse("[DONE]"),
    ]
    batch = Batch(events, TERMINAL)
    assert batch.encode() == b"".join(e.encode() for e in events)
    assert batch.event == "response.completed"
    assert Batch(events[:1], TERMINAL).event == "response.output_text.done"
