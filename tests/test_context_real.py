"""Agent-sized context through the real server and the bundled model (its trained
context, 8,192 tokens, by default): a 6,000-token prompt completes; a longer one is
refused with ``context_length_exceeded`` before anything is queued; with
``truncation: "auto"`` its oldest input item is dropped and the rest runs (from the
cached prefix of the first request, which held exactly that rest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmsp.bootstrap import bundled_model_path
from lmsp.engines.llama_cpp import LlamaTokenizer
from tests.helpers import Server, open_db

MODEL = "smollm2-135m-instruct"


def passage(label: str, tokens: int, tokenizer: LlamaTokenizer) -> str:
    """A text of about ``tokens`` tokens: numbered notes of a ship's log."""
    lines: list[str] = []
    i = 0
    while True:
        lines.append(f"{label} note {i}: the keeper logged wind, tide and a passing ship.")
        i += 1
        if i % 20 == 0:
            text = "\n".join(lines)
            if len(tokenizer.prompt_tokens([{"role": "user", "content": text}])) >= tokens:
                return text


def said(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def test_a_6000_token_prompt_completes_and_a_longer_one_is_refused_or_truncated(
    tmp_path: Path,
) -> None:
    tokenizer = LlamaTokenizer(bundled_model_path(), 0)
    try:
        a, b, c = (passage(label, 3000, tokenizer) for label in ("Alpha", "Bravo", "Charlie"))
    finally:
        tokenizer.close()
    data_dir = tmp_path / "data"
    server = Server(data_dir, env={"LMSP_PARALLEL": "2"}).start()
    try:
        with server.client(timeout=600) as http:
            body = {"model": MODEL, "input": [said(b), said(c)], "max_output_tokens": 8}
            done = http.post("/v1/responses", json=body).json()
            assert done["status"] == "incomplete", done  # 8 tokens generated
            assert 6000 <= done["usage"]["input_tokens"] < 8192

            conn = open_db(data_dir)
            before = conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
            conn.close()
            longer = {**body, "input": [said(a), said(b), said(c)]}
            refused = http.post("/v1/responses", json={**longer, "background": True})
            assert refused.status_code == 400
            assert refused.json()["error"]["code"] == "context_length_exceeded"
            conn = open_db(data_dir)
            assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == before
            conn.close()

            trimmed = http.post("/v1/responses", json={**longer, "truncation": "auto"}).json()
            assert trimmed["status"] == "incomplete", trimmed
            assert trimmed["truncation"] == "auto"
            assert trimmed["truncated_input"]["items"] == 1
            assert trimmed["usage"]["input_tokens"] == done["usage"]["input_tokens"]
            cached = trimmed["usage"]["input_tokens_details"]["cached_tokens"]
            assert cached > 5000  # the first request's prompt, still in its sequence
    finally:
        server.stop()
