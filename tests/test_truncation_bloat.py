"""A long conversation with ``truncation: "auto"`` stores each turn in about the same
bytes (issue 30, item 3), on a real ``lmsp serve``.

Before: every lifecycle event of a turn carried the whole ``truncated_input.dropped``
list, which grows with every turn of a chain (each drops the older turns' items): an
18-turn chain of 150 KB requests made one response 6.4 MB of request row plus 28.8 MB of
events. Now a truncation is recorded as a count and its first and last items, so a turn's
request row and events stay the size of its own input and output; the history is stored
once (each turn refers to the one it continues).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.helpers import served

pytestmark = pytest.mark.slow

TURNS = 20
ITEMS = 50  # small items a turn: the test engine's context holds 4096 bytes


def stored_bytes(db: Path, response_id: str) -> int:
    """The turn's request row and the bytes of its events."""
    conn = sqlite3.connect(db)
    try:
        (request,) = conn.execute(
            "SELECT length(request) FROM responses WHERE id = ?", (response_id,)
        ).fetchone()
        (events,) = conn.execute(
            "SELECT coalesce(sum(length(e.data)), 0) FROM task_events e"
            " JOIN tasks t ON t.id = e.task_id WHERE t.response_id = ?",
            (response_id,),
        ).fetchone()
        return int(request) + int(events)
    finally:
        conn.close()


def test_a_truncated_chain_grows_linearly(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with served(data_dir, {"LMSP_TEST_ENGINE_DELAY": "0"}) as server, server.client() as http:
        previous = None
        sizes: list[tuple[int, int]] = []  # (items dropped, bytes stored) per turn
        for turn in range(TURNS):
            body = {
                "model": "lmsp-test",
                "input": [{"role": "user", "content": f"t{turn} i{i}"} for i in range(ITEMS)],
                "truncation": "auto",
                "max_output_tokens": 8,
                "previous_response_id": previous,
            }
            answer = http.post("/v1/responses", json=body)
            assert answer.status_code == 200, answer.text
            done = answer.json()
            previous = done["id"]
            dropped = done["truncated_input"]
            sizes.append(
                (dropped["items"] if dropped else 0, stored_bytes(data_dir / "lmsp.db", done["id"]))
            )
        truncated = [(n, size) for n, size in sizes if n]
        print("dropped items and stored bytes per truncated turn:", truncated)
        assert len(truncated) >= 8 and truncated[-1][0] >= truncated[0][0] + 6 * ITEMS
        # the last turn dropped hundreds of items more than the first truncated one,
        # yet is stored in about the same bytes
        assert truncated[-1][1] < 1.3 * truncated[0][1], truncated
        last = http.get(f"/v1/responses/{previous}").json()["truncated_input"]
        assert set(last) == {"items", "first", "last"}
        assert last["first"]["role"] == "user" and last["first"]["id"].startswith("msg_")
