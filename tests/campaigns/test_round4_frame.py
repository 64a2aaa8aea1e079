"""Round 4's hostile frames on the engine seam (issue 40): an engine step's tokens packed
in one :class:`~lmsp.engines.protocol.Step`, counting violations (the campaign fails
once, at the end, with all of them) and printing its figures.

Each frame holds a random number of sequences (1-256), each with 0-6 pieces of hostile
text (astral and combining characters, NUL and control characters, U+FFFD, the empty
text of a token inside a UTF-8 character, a long run), random log-probabilities
(extreme and subnormal floats, ``-inf``, byte lists of partial characters), with or
without ``cached_tokens``, between ``Progress``, ``Done`` and ``Error`` messages. Sent
through a real pipe and read by a real :class:`~lmsp.engines.client.EngineClient`'s
reader thread: every stream must get exactly its own pieces, in order, every field
intact, and then its end.

``make test``: 40 frames; ``make torture`` (``LMSP_CAMPAIGN=long``): 2,000.
"""

from __future__ import annotations

import math
import multiprocessing
import random
import threading
from pathlib import Path
from typing import Any

from lmsp.engines.base import LoadOptions, Piece
from lmsp.engines.client import EngineClient, Stream
from lmsp.engines.protocol import Done, Error, Progress, Ready, Tokens, pack
from lmsp.engines.worker import EngineSpec
from tests.campaigns.invariants import long_run, report

FRAMES = 2000 if long_run() else 40
ALPHABET = [
    "a",
    " ",
    "\n",
    "\x00",
    "\x7f",
    "é",
    "日",
    "🙂",
    "\u0301",
    "\ufffd",
    "\u200d",
    "\\",
    '"',
]
FLOATS = [0.0, -0.0, -1e-320, -1e308, -math.inf, -0.1, -2.5]


def text(rng: random.Random) -> str:
    if rng.random() < 0.2:
        return ""  # a token inside a UTF-8 character
    if rng.random() < 0.05:
        return rng.choice(ALPHABET) * rng.randint(100, 5000)
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 12)))


def logprobs(rng: random.Random) -> dict[str, Any] | None:
    if rng.random() < 0.5:
        return None
    partial = [0xE6, 0x97] if rng.random() < 0.5 else list(text(rng).encode())
    top = [
        {"token": text(rng), "logprob": rng.choice(FLOATS), "bytes": partial}
        for _ in range(rng.randint(0, 5))
    ]
    return {
        "token": text(rng),
        "logprob": rng.choice(FLOATS),
        "bytes": partial,
        "top_logprobs": top,
    }


def frame(rng: random.Random, ids: list[int], first: set[int]) -> list[Any]:
    messages: list[Any] = []
    for sid in ids:
        if rng.random() < 0.1:
            messages.append(Progress(sid, rng.randint(0, 99), 100, 0, rng.random()))
        pieces = [
            Piece(rng.randint(0, 2**31 - 1), text(rng), logprobs(rng))
            for _ in range(rng.randint(0, 6))
        ]
        cached = rng.randint(0, 2**40) if sid in first else None
        first.discard(sid)
        messages.append(Tokens(sid, pieces, cached))
    return messages


def reader() -> tuple[EngineClient, Any]:
    """A real client whose reader thread reads one end of a real pipe."""
    here, there = multiprocessing.Pipe()
    spec = EngineSpec(None, Path("."), 1 << 20, LoadOptions(256), "frames")
    client = EngineClient(spec)
    client._conn = there
    client._reader = threading.Thread(target=client._read, daemon=True)
    client._reader.start()
    here.send([Ready(0, 1 << 20, 256, 0)])
    client.wait(10)
    return client, here


def run_frame(rng: random.Random, violations: list[str]) -> int:
    client, here = reader()
    n = rng.randint(1, 256)
    streams: list[Stream] = []
    for _ in range(n):
        streams.append(client.generate([1], [], None))  # type: ignore[arg-type]
    ids = [s.id for s in streams]
    want: dict[int, list[Piece]] = {sid: [] for sid in ids}
    cached: dict[int, int | None] = {}
    first = set(ids)
    ends: dict[int, Any] = {}
    sent = 0
    for _ in range(rng.randint(1, 8)):
        live = [sid for sid in ids if sid not in ends]
        messages = frame(rng, rng.sample(live, rng.randint(0, len(live))), first)
        for m in messages:
            if isinstance(m, Tokens):
                want[m.id] += m.pieces
                cached.setdefault(m.id, m.cached_tokens)
                sent += len(m.pieces)
        for sid in rng.sample(live, rng.randint(0, len(live) // 4)):
            end = Done(sid, "stop") if rng.random() < 0.7 else Error(sid, "engine_error", text(rng))
            ends[sid] = end
            messages.append(end)
        here.send(pack(messages))
    here.send(pack([Done(sid, "length") for sid in ids if sid not in ends]))
    for stream in streams:
        got: list[Piece] = []
        try:
            got.extend(stream)
        except Exception as exc:  # an Error end: after every piece before it
            if not isinstance(ends.get(stream.id), Error):
                violations.append(f"stream {stream.id} raised {exc!r}")
        if got != want[stream.id]:
            violations.append(f"stream {stream.id}: {len(got)} pieces, {len(want[stream.id])} sent")
        if stream.cached_tokens != (cached.get(stream.id) or 0):
            violations.append(f"stream {stream.id}: cached {stream.cached_tokens}")
    client.stopping()
    here.close()
    client.close(5)
    return sent


def test_hostile_frames_reach_their_streams_whole() -> None:
    rng = random.Random(40)
    violations: list[str] = []
    pieces = sum(run_frame(rng, violations) for _ in range(FRAMES))
    report(
        f"frames: {FRAMES} campaigns of up to 256 sequences, {pieces:,} pieces, "
        f"{len(violations)} violations"
    )
    assert not violations, violations[:20]
