"""A long chain of big requests with ``truncation: "auto"`` leaves the API process's
memory where it was (issue 30, hardening, third round), on a real ``lmsp serve``.

Before: each turn read its whole ``previous_response_id`` history and rendered and
tokenized all of it, several times, to count it, in the API process: a chain of 150 KB
requests grew it by about 4 MB a turn, kept (36 turns: 131 → 283 MB). Now the history
is read newest first until the context is full, and a runner reads only the items kept:
its memory stays flat however long the chain (36 turns: about 130 → 150 MB). The
answers are the same: what was dropped, the tokens counted, what the model was given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lmsp.engines.deterministic import N_CTX
from tests.helpers import served

pytestmark = pytest.mark.slow

TURNS = 36
ITEMS = 100  # a turn's input: 100 items of 1.5 KB, 150 KB (the context holds 4096 bytes)
SIZE = 1500
MB = 1024 * 1024


def rss(pid: int) -> int:
    """The resident memory of the process ``pid`` in bytes (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def turn_input(turn: int) -> list[dict[str, Any]]:
    return [
        {"type": "message", "role": "user", "content": f"turn {turn} item {i} " + "x" * SIZE}
        for i in range(ITEMS)
    ]


def text(response: dict[str, Any]) -> str:
    return str(response["output"][0]["content"][0]["text"])


def test_a_long_chain_of_big_requests_leaves_memory_flat(tmp_path: Path) -> None:
    env = {"LMSP_TEST_ENGINE_DELAY": "0"}
    with served(tmp_path / "data", env) as server, server.client(timeout=120) as http:
        assert server.proc is not None
        pid = server.proc.pid  # the API process (the engine runs in a child of it)
        previous: str | None = None
        first_id: str | None = None
        seen: list[int] = []
        for turn in range(TURNS):
            body = {
                "model": "lmsp-test",
                "input": turn_input(turn),
                "truncation": "auto",
                "temperature": 0,
                "max_output_tokens": 8,
                "previous_response_id": previous,
            }
            counted = http.post("/v1/responses/input_tokens", json=body)
            assert counted.status_code == 200, counted.text
            answer = http.post("/v1/responses", json=body)
            assert answer.status_code == 200, answer.text
            done = answer.json()
            assert done["status"] == "incomplete", done  # ran, up to max_output_tokens
            if first_id is None:
                listed = http.get(f"/v1/responses/{done['id']}/input_items?order=asc&limit=1")
                first_id = listed.json()["data"][0]["id"]
            # every turn keeps its last two items: the context before them, 100 items a
            # turn and one answer, is dropped; the record names the chain's first item
            dropped = done["truncated_input"]
            assert set(dropped) == {"items", "first", "last"}, dropped
            assert dropped["items"] == (ITEMS + 1) * turn + ITEMS - 2, (turn, dropped)
            assert dropped["first"] == {"id": first_id, "type": "message", "role": "user"}
            assert dropped["last"]["role"] == "user"
            tokens = done["usage"]["input_tokens"]
            assert tokens == counted.json()["input_tokens"] and tokens < N_CTX
            if turn == TURNS - 1:  # the model was given the two items kept, and only them
                alone = {**body, "input": turn_input(turn)[-2:], "previous_response_id": None}
                fresh = http.post("/v1/responses", json=alone).json()
                assert fresh["truncated_input"] is None
                assert fresh["usage"]["input_tokens"] == tokens
                assert text(fresh) == text(done)
            previous = done["id"]
            seen.append(rss(pid))

        # without truncation the chain no longer fits: refused, as before
        over = {"model": "lmsp-test", "input": "one more", "previous_response_id": previous}
        refused = http.post("/v1/responses", json=over)
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "context_length_exceeded"

        print("API process RSS per turn (MB):", [round(r / MB) for r in seen])
        # the history grew to 5.4 MB of items; the process did not follow it (it grew by
        # about 4 MB a turn, 110 MB in all, when each turn read its whole history)
        assert seen[-1] - seen[0] < 64 * MB, seen
        assert seen[-1] - seen[TURNS // 3] < 24 * MB, seen
