"""A hostile stand-in for a remote upstream (tests/campaigns/test_round4_R38.py): it
answers as llama-server does where lmsp asks what it is (``/health``, ``/props``,
``/tokenize`` with the bundled model's own tokenizer, a short greedy ``/completion``),
so a model can be added on it, and then misbehaves in the way :attr:`StandIn.mode`
says while streaming. The real upstream of the remote-engine tests is llama-server
itself (tests/upstream.py); this one only plays what a real one should never do.

Modes: ``ok`` (a well-formed answer), ``garbage`` (a line that is not JSON), ``oov`` (a
token id outside the vocabulary), ``cut`` (the stream ends before its last chunk),
``http500`` and ``http400`` (refusals), ``mistokenize`` (``/tokenize`` disagrees: an
add is refused), ``nonsense`` (``/props`` and ``/tokenize`` answer junk).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lmsp.bootstrap import bundled_model_path
from lmsp.engines.llama_cpp import LlamaTokenizer
from tests.standin_http import JsonHandler

MODES = ("ok", "garbage", "oov", "cut", "http500", "http400")


class StandIn:
    def __init__(self) -> None:
        self.mode = "ok"
        self.tokenizer = LlamaTokenizer(bundled_model_path(), 0)
        self.lock = threading.Lock()
        self.answer = self.tokenize("The sea is calm and the light is bright tonight.")[1:]
        handler = _handler(self)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def tokenize(self, text: str) -> list[int]:
        with self.lock:
            return self.tokenizer.raw_tokens(text)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.tokenizer.close()


def _handler(stand: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        protocol_version = "HTTP/1.0"  # a body ends when the connection closes

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, {"status": "ok"})
            elif self.path == "/props" and stand.mode == "nonsense":
                self._json(200, {"default_generation_settings": "n_ctx", "total_slots": []})
            elif self.path == "/props":
                self._json(200, {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 4})
            else:
                self._json(404, {"error": {"message": "not here"}})

        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(size) or b"{}")
            if self.path == "/tokenize":
                tokens = stand.tokenize(str(body.get("content", "")))
                if stand.mode == "mistokenize":
                    tokens = [t + 1 for t in tokens]
                if stand.mode == "nonsense":
                    self._json(200, {"tokens": "many"})
                    return
                self._json(200, {"tokens": tokens})
            elif self.path == "/completion" and not body.get("stream"):
                if body.get("grammar"):
                    self._json(400, {"error": {"message": "llguidance is not enabled"}})
                    return
                n = int(body.get("n_predict") or 8)
                self._json(200, {"tokens": stand.answer[:n], "stop": True, "stop_type": "limit"})
            elif self.path == "/completion":
                self._stream(body)
            else:
                self._json(501, {"error": {"message": "not served"}})

        def _stream(self, body: dict[str, Any]) -> None:
            mode = stand.mode
            if mode in ("http500", "http400"):
                self._json(int(mode[4:]), {"error": {"message": f"the stand-in's {mode}"}})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            limit = int(body.get("n_predict") or -1)
            tokens = stand.answer if limit < 0 else stand.answer[:limit]
            for i, token in enumerate(tokens):
                if mode == "cut" and i == 3:
                    return  # the connection closes: no last chunk
                if mode == "garbage" and i == 2:
                    self.wfile.write(b"data: {not json\n\n")
                    return
                sent = 10**9 if mode == "oov" and i == 2 else token
                chunk = {"content": "", "tokens": [sent], "stop": False, "tokens_predicted": i + 1}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            end = {"content": "", "tokens": [], "stop": True, "stop_type": "limit"}
            end["tokens_predicted"] = len(tokens)
            self.wfile.write(b"data: " + json.dumps(end).encode() + b"\n\n")

    return Handler
