"""(t) An engine step's frame, carried and read (issue 40): µs a token, each side.

One engine step of ``--streams`` sequences, one new token each (text: a word, as the
deterministic engine's; ``--logprobs``: with an entry of 5 alternatives), built as the
engine builds it (:func:`lmsp.engines.protocol.pack` where the code has it) and:

- **engine**: made into the bytes the pipe carries (the frame pickled as
  :mod:`multiprocessing` does);
- **reader**: read back by a real :class:`~lmsp.engines.client.EngineClient`'s reader
  thread (unpickled, decoded, each sequence's tokens handed to its stream), frames fed
  to it from memory, no pipe;
- **stream**: the pieces taken out of the streams (what the runner calls, per piece).

CPU µs a generated token, the median of ``--reps`` runs of ``--steps`` steps. Run it on
another checkout's code with ``PYTHONPATH=<its src>`` to compare (the engine side packs
only where ``pack`` exists).

    .venv/bin/python bench/frame.py [--streams 64] [--steps 2000] [--reps 5] [--logprobs]
"""

from __future__ import annotations

import argparse
import statistics
import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

from lmsp.engines import protocol
from lmsp.engines.base import LoadOptions, Piece
from lmsp.engines.client import EngineClient, Stream
from lmsp.engines.protocol import Done, Tokens
from lmsp.engines.worker import EngineSpec


def step_messages(streams: int, step: int, logprobs: bool) -> list[Any]:
    out: list[Any] = []
    for sid in range(1, streams + 1):
        entry = None
        if logprobs:
            top = [
                {"token": f"w{k}", "logprob": -0.5 * k, "bytes": [119, 48 + k]} for k in range(5)
            ]
            entry = {"token": "word", "logprob": -0.1, "bytes": [119, 111], "top_logprobs": top}
        out.append(Tokens(sid, [Piece(1000 + step % 50, f"word{step % 50} ", entry)], None))
    return out


class Feed:
    """A channel end that gives the reader frames from memory, then EOF."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = iter(frames)

    def recv(self) -> Any:
        data = next(self.frames, None)
        if data is None:
            raise EOFError
        return ForkingPickler.loads(data)

    def close(self) -> None:
        pass


def run(streams: int, steps: int, logprobs: bool) -> tuple[float, float, float]:
    pack = getattr(protocol, "pack", lambda messages: messages)
    built = [step_messages(streams, i, logprobs) for i in range(steps)]
    built[-1] += [Done(sid, "stop") for sid in range(1, streams + 1)]
    t0 = time.process_time()
    frames = [bytes(ForkingPickler.dumps(pack(messages))) for messages in built]
    engine = time.process_time() - t0
    spec = EngineSpec(None, Path("."), 4096, LoadOptions(sequences=streams), model="bench")
    client = EngineClient(spec)
    client._conn = Feed(frames)
    client._ready.set()
    client._closing = True
    taken: list[Stream] = []
    for sid in range(1, streams + 1):
        stream = Stream(client, sid)
        client._streams[sid] = stream
        taken.append(stream)
    t0 = time.process_time()
    client._read()
    reader = time.process_time() - t0
    t0 = time.process_time()
    n = 0
    for stream in taken:
        for _ in stream:
            n += 1
    consumer = time.process_time() - t0
    assert n == streams * steps, n
    per = 1e6 / n
    return engine * per, reader * per, consumer * per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--logprobs", action="store_true")
    args = parser.parse_args()
    runs = [run(args.streams, args.steps, args.logprobs) for _ in range(args.reps)]
    packed = "packed (Step)" if hasattr(protocol, "pack") else "pickled (Tokens each)"
    print(f"frame: {args.streams} sequences a step, {packed}, logprobs={args.logprobs}")
    for i, side in enumerate(("engine (pack + pickle)", "reader (unpickle + route)", "stream")):
        figures = sorted(r[i] for r in runs)
        print(f"  {side:28s} {statistics.median(figures):6.2f} µs a token  (runs {figures})")


if __name__ == "__main__":
    main()
