"""The deterministic engine's settable answer length (``LMSP_TEST_ENGINE_LENGTH``),
through a real ``lmsp serve``: the scale benchmarks stream long answers with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmsp.engines import deterministic
from tests.helpers import Server

pytestmark = pytest.mark.slow


def test_the_answer_runs_to_the_length_set(tmp_path: Path) -> None:
    server = Server(
        tmp_path / "data",
        env={"LMSP_TEST_ENGINE_DELAY": "0", "LMSP_TEST_ENGINE_LENGTH": "300"},
    ).start()
    try:
        with server.client() as client:
            body = {"model": "lmsp-test", "input": "a long one", "temperature": 0}
            answer = client.post("/v1/responses", json=body).json()
            short = client.post("/v1/responses", json={**body, "max_output_tokens": 5}).json()
    finally:
        server.stop()
    assert answer["status"] == "completed", answer
    assert answer["usage"]["output_tokens"] == 300
    text = answer["output"][0]["content"][0]["text"]
    assert text.count(" ") == 300  # one word a token, each with its space
    assert set(text.split()) <= {w for w in deterministic.WORDS}
    assert short["status"] == "incomplete" and short["usage"]["output_tokens"] == 5
