"""Streams carry the log's own bytes (issue 40's tail: a follower takes what its process
has just committed from the writer's tail, not from the database).

Through the real server with the test engine: twelve responses generate at once, each
followed by a stream from its first event; every stream's events are then compared, byte
for byte, with the log read back from the database — the numbers gap-free from 0 to the
terminal event, the JSON of each the stored JSON — and a stream resumed from the middle
of each log is the stored log after that number."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from tests.helpers import Server, open_db, stored_events

STREAMS = 12
ALL = {"stream": "true", "include": "lmsp.lifecycle"}  # every event of the log


def data_lines(answer: httpx.Response) -> list[str]:
    return [
        line[len("data: ") :]
        for line in answer.iter_lines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def test_every_stream_is_the_stored_log_byte_for_byte(tmp_path: Path) -> None:
    env = {
        "LMSP_TEST_ENGINE_LENGTH": "60",
        "LMSP_TEST_ENGINE_DELAY": "0.01",  # streams followed live, not read after the end
        "LMSP_PARALLEL": str(STREAMS),
    }
    server = Server(tmp_path / "data", env=env).start()
    try:
        with server.client(timeout=120) as http:
            ids = []
            for n in range(STREAMS):
                body = {"model": "lmsp-test", "input": f"story {n}", "background": True}
                created = http.post("/v1/responses", json=body)
                assert created.status_code == 202, created.text
                ids.append(created.json()["id"])
        streamed: dict[str, list[str]] = {}

        def follow(rid: str) -> None:
            with (
                server.client(timeout=120) as http,
                http.stream("GET", f"/v1/responses/{rid}", params=ALL) as answer,
            ):
                streamed[rid] = data_lines(answer)

        threads = [threading.Thread(target=follow, args=(rid,)) for rid in ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        conn = open_db(server.data_dir)
        try:
            tasks = dict(conn.execute("SELECT response_id, id FROM tasks").fetchall())
        finally:
            conn.close()
        for rid in ids:
            log = stored_events(server.data_dir, tasks[rid])
            assert [seq for seq, _ in log] == list(range(len(log)))
            assert streamed[rid] == [data for _, data in log], rid
            assert '"response.completed"' in log[-1][1]
            middle = len(log) // 2
            with server.client(timeout=120) as http:
                params = {**ALL, "starting_after": str(middle)}
                with http.stream("GET", f"/v1/responses/{rid}", params=params) as answer:
                    assert data_lines(answer) == [data for seq, data in log if seq > middle]
    finally:
        server.stop()
