"""An engine step's frame (issue 40): every sequence's new tokens packed in one
:class:`~lmsp.engines.protocol.Step` (MessagePack, decoded once by the reader thread),
carried and read back whole: every field, several sequences in one frame, text beyond
ASCII and a token that ends inside a UTF-8 character."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from lmsp.engines.base import Piece
from lmsp.engines.core import Seq
from lmsp.engines.protocol import Done, Error, Progress, Step, Tokens, pack, unpack
from tests.engines.test_core import GREEDY, FakeBackend, thread_client

#: a token that ends inside "日" (its first two bytes of three): no text yet
PARTIAL = {
    "token": "\ufffd",
    "logprob": -1.2345678901234567,
    "bytes": [0xE6, 0x97],
    "top_logprobs": [
        {"token": "\ufffd", "logprob": -1.2345678901234567, "bytes": [0xE6, 0x97]},
        {"token": "é", "logprob": -2.5, "bytes": [0xC3, 0xA9]},
    ],
}


def test_a_frame_of_several_sequences_round_trips_every_field() -> None:
    one = Tokens(1, [Piece(10, "héllo "), Piece(11, "", PARTIAL), Piece(12, "日本 🙂\n")], 7)
    two = Tokens(2, [], 0)  # the first word of a sequence: its cached tokens, no piece
    three = Tokens(3, [Piece(0, "\x00\t\"'\\", None), Piece(2**31 - 1, "ß" * 300, None)])
    sent: list[Any] = [one, Progress(4, 32, 320, 8, 0.75), two, Done(1, "stop"), three]
    sent.append(Error(5, "engine_error", "Ça a échoué."))
    here, there = multiprocessing.Pipe()
    try:
        here.send(pack(sent))
        frame = there.recv()  # pickled across a real pipe, as an engine's frame is
    finally:
        here.close()
        there.close()
    assert isinstance(frame[0], Step) and sum(isinstance(m, Step) for m in frame) == 1
    assert not any(isinstance(m, Tokens) for m in frame)  # none pickled one by one
    got = unpack(frame)
    assert got == [one, two, three, sent[1], sent[3], sent[5]]  # tokens first, then in order
    first = got[0]
    assert isinstance(first, Tokens) and first.cached_tokens == 7 and first.id == 1
    assert [(p.token, p.text, p.logprobs) for p in first.pieces] == [
        (10, "héllo ", None),
        (11, "", PARTIAL),
        (12, "日本 🙂\n", None),
    ]
    assert isinstance(got[1], Tokens) and got[1].pieces == [] and got[1].cached_tokens == 0
    assert isinstance(got[2], Tokens) and got[2].cached_tokens is None
    assert got[2].pieces[1] == Piece(2**31 - 1, "ß" * 300)


def test_a_frame_with_no_tokens_is_sent_as_it_is() -> None:
    messages: list[Any] = [Done(1, "cancelled"), Error(2, "engine_error", "no")]
    assert pack(messages) == messages and unpack(pack(messages)) == messages


class Multilingual(FakeBackend):
    """Pieces beyond ASCII, one ending inside a character, with logprobs."""

    def pick(self, seq: Seq, logits: Any) -> Piece | None:
        piece = super().pick(seq, logits)
        if piece is None:
            return None
        n = piece.token - 100
        if n % 3 == 1:
            return Piece(piece.token, "", PARTIAL)
        return Piece(piece.token, f"{n}·日{seq.id} ", {"token": "x", "logprob": -n / 3})


def test_the_reader_hands_each_sequence_its_own_pieces(tmp_path: Path) -> None:
    """Two sequences stepped together by a real core: their frames carry both, and the
    client's reader gives each stream its own pieces, every field intact."""
    client = thread_client(Multilingual(sequences=2), tmp_path)
    try:
        streams = [client.generate([n, 0], [], GREEDY) for n in (6, 4)]
        got = [[(p.token, p.text, p.logprobs) for p in stream] for stream in streams]
    finally:
        client.close()
    for stream, pieces, n in zip(streams, got, (6, 4), strict=True):
        want = []
        for i in range(n):
            entry = (100 + i, "", PARTIAL) if i % 3 == 1 else None
            entry = entry or (100 + i, f"{i}·日{stream.id} ", {"token": "x", "logprob": -i / 3})
            want.append(entry)
        assert pieces == want
        assert stream.cached_tokens == 0
