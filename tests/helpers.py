"""Test helpers: a real ``lmsp serve`` subprocess and log checks on real SQLite files."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from lmsp.protocol.assembler import OutputAssembler, TextDelta

TERMINAL_EVENTS = {
    "response.completed",
    "response.incomplete",
    "response.failed",
    "response.cancelled",
}
EVENT_FOR_STATUS = {
    "completed": {"response.completed", "response.incomplete"},
    "failed": {"response.failed"},
    "cancelled": {"response.cancelled"},
}


#: the session's one copy of the bundled model (set by ``tests.conftest``): a server the
#: tests start on a new data directory links it rather than copying 98 MB (some 200
#: copies a suite filled the disk CI shares)
BLOB_CACHE: Path | None = None


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: held all at once while they are picked (one port
    picked, released and picked again may come back the same, and two servers started
    side by side would then share it: one serving, the other refused for the lock)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


class Server:
    """``lmsp serve`` in a subprocess on a data directory that outlives it."""

    def __init__(
        self,
        data_dir: Path,
        env: dict[str, str] | None = None,
        *,
        port: int | None = None,
        args: tuple[str, ...] = (),
        log_name: str = "server",
        seed: bool = True,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.extra_env = env or {}
        self.args = args  # after ``lmsp serve``
        self.seed = seed  # a new directory gets the cached model linked (BLOB_CACHE)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-{log_name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return (self.data_dir / "owner.token").read_text().strip()

    def client(self, timeout: float = 60) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=timeout,
        )

    def start(self, wait: float = 120) -> Server:
        self.launch()
        return self.wait_healthy(wait)

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the process without waiting for it to serve."""
        if self.seed and BLOB_CACHE is not None and not (self.data_dir / "blobs").exists():
            seeded_data_dir(self.data_dir, BLOB_CACHE)
        env = dict(os.environ)
        env.update(
            {
                "LMSP_DATA_DIR": str(self.data_dir),
                "LMSP_PORT": str(self.port),
                "LMSP_HOST": "127.0.0.1",
                "LMSP_ENABLE_TEST_ENGINE": "1",
            }
        )
        env.update(self.extra_env)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lmsp", "serve", *self.args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self.proc

    def wait_healthy(self, wait: float = 120) -> Server:
        assert self.proc is not None
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not become healthy")

    def kill(self) -> None:
        """``kill -9``: no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.proc = None

    def standby(self) -> Server:
        """An ``lmsp serve --standby`` on this server's directory and port, launched and
        waiting to take over."""
        spare = Server(
            self.data_dir,
            env=self.extra_env,
            port=self.port,
            args=("--standby",),
            log_name="standby",
        )
        spare.launch()
        deadline = time.monotonic() + 120
        while "taking over when it exits" not in spare.log_path.read_text(errors="replace"):
            assert spare.proc is not None and spare.proc.poll() is None, spare.log_path.read_text()
            assert time.monotonic() < deadline, spare.log_path.read_text()[-2000:]
            time.sleep(0.05)
        return spare

    def restart(self) -> Server:
        self.kill()
        return self.start()


@contextlib.contextmanager
def served(data_dir: Path, env: dict[str, str] | None = None) -> Iterator[Server]:
    """A real ``lmsp serve`` on ``data_dir`` for the block's length (a fixture's)."""
    srv = Server(data_dir, env).start()
    try:
        yield srv
    finally:
        srv.stop()


def llama_tokens(text: str, special: bool = True) -> int:
    """The text's tokens by llama.cpp itself (the bundled model's vocabulary, a BOS first,
    no template)."""
    from llama_cpp import Llama

    from lmsp.bootstrap import bundled_model_path

    llm: Any = Llama(model_path=str(bundled_model_path()), vocab_only=True, verbose=False)
    try:
        return len(llm.tokenize(text.encode(), add_bos=True, special=special))
    finally:
        llm.close()


def children(pid: int) -> list[int]:
    """The processes ``pid`` started that still run (its engine processes, …)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def exited(pid: int) -> bool:
    """The process has exited (a zombie waiting for its reaper counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def wait_exited(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while not exited(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def open_db(data_dir: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(data_dir / "lmsp.db"), timeout=30)
    conn.row_factory = sqlite3.Row
    return conn


def task_log(conn: sqlite3.Connection, task_id: str) -> list[dict[str, Any]]:
    return [
        json.loads(r[0])
        for r in conn.execute(
            "SELECT data FROM task_events WHERE task_id = ? ORDER BY sequence_number", (task_id,)
        )
    ]


def stored_events(data_dir: Path, task_id: str) -> list[tuple[int, str]]:
    """``(sequence number, JSON as stored)`` of a task's log, in order."""
    conn = open_db(data_dir)
    try:
        rows = conn.execute(
            "SELECT sequence_number, data FROM task_events WHERE task_id = ?"
            " ORDER BY sequence_number",
            (task_id,),
        ).fetchall()
    finally:
        conn.close()
    return [(int(seq), str(data)) for seq, data in rows]


def check_log_invariants(conn: sqlite3.Connection) -> None:
    """Every log is gap-free from 0, the task row holds its last number, a finished task
    has exactly one terminal event and it is the last, and the status matches it."""
    for task in conn.execute("SELECT * FROM tasks"):
        events = task_log(conn, task["id"])
        seqs = [e["sequence_number"] for e in events]
        assert seqs == list(range(len(events))), (task["id"], seqs)
        assert task["last_sequence_number"] == len(events) - 1
        terminal = [e for e in events if e["type"] in TERMINAL_EVENTS]
        if task["status"] in EVENT_FOR_STATUS:
            assert len(terminal) == 1, (task["id"], [e["type"] for e in events])
            assert events[-1]["type"] in EVENT_FOR_STATUS[task["status"]]
        else:
            assert terminal == [], (task["id"], task["status"])
        check_snapshot(conn, task)
    if getattr(conn, "dialect", "sqlite") == "sqlite":  # PostgreSQL keeps its own pages
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def log_violations(data_dir: Path) -> list[str]:
    """What :func:`check_log_invariants` finds wrong in ``data_dir``'s database, as a
    campaign's violations (none: an empty list)."""
    conn = open_db(data_dir)
    try:
        check_log_invariants(conn)
    except AssertionError as exc:
        return [f"log invariants: {exc}"]
    finally:
        conn.close()
    return []


def queue_background(svc: Any, body: dict[str, Any] | None = None) -> str:
    """Queue a background response on an open service (``open_service``) as its create
    route does, in one writer transaction, for the service's owner; its task's id."""
    from lmsp.protocol.request import from_stored
    from lmsp.store import responses

    conn = svc.db.reader()
    query = "SELECT value FROM service_config WHERE key = 'owner_client_id'"
    owner = conn.execute(query).fetchone()[0]
    request = from_stored(body or {"model": "lmsp-test", "input": "hello", "background": True})

    def create(c: Any) -> Any:
        return responses.create(
            c, client_id=owner, request=request, on_restart="fail", max_queue=1000, key=None
        )

    return str(svc.db.write_sync(create).task_id)


def finish(http: httpx.Client, response_id: str, timeout: float = 600) -> dict[str, Any]:
    """The response once it is no longer queued or in progress (polled)."""
    deadline = time.monotonic() + timeout
    while (obj := http.get(f"/v1/responses/{response_id}").json())["status"] in (
        "queued",
        "in_progress",
    ):
        assert time.monotonic() < deadline, obj
        time.sleep(0.05)
    return obj


def check_snapshot(conn: sqlite3.Connection, task: sqlite3.Row) -> None:
    """A task's token chunks run gap-free from 0 and, with the tail its snapshot JSON
    holds, add up to the count it records; a finished task has neither."""
    stored = 0
    for start, size in conn.execute(
        "SELECT start, length(tokens) FROM task_tokens WHERE task_id = ? ORDER BY start",
        (task["id"],),
    ):
        assert start == stored, (task["id"], start, stored)
        stored += size // 4
    snap = json.loads(task["snapshot"]) if task["snapshot"] else None
    if task["status"] in EVENT_FOR_STATUS:
        assert snap is None and stored == 0, (task["id"], task["status"])
    chunked = snap["token_count"] - len(snap["tail"]) if snap and "token_count" in snap else 0
    assert stored == chunked, (task["id"], stored, chunked)


def early_starts(http: httpx.Client) -> dict[str, int]:
    """Creates' first turns begun early (runner/early.py), by outcome (``/metrics``)."""
    text = http.get("/metrics").text
    found = re.findall(r'^lmsp_early_starts_total\{outcome="(\w+)"\} ([0-9.e+]+)$', text, re.M)
    return {outcome: int(float(count)) for outcome, count in found}


def idle(http: httpx.Client) -> None:
    """Until no task holds the model and its worker is back waiting."""
    deadline = time.monotonic() + 30
    while any(m["busy"] for m in http.get("/v1/service/activity").json()["models"]):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # from letting go of its slot to waiting for the next claim: a log line and a read
    # (milliseconds), given ample room on a loaded machine
    time.sleep(0.3)


def seeded_data_dir(data_dir: Path, blob_cache: Path) -> Path:
    """A fresh data directory whose blob store already links the bundled model, so a
    first start does not copy 92 MB."""
    blobs = data_dir / "blobs"
    blobs.mkdir(parents=True, mode=0o700)
    for blob in blob_cache.iterdir():
        os.link(blob, blobs / blob.name)
    return data_dir


def message_text(output: list[dict[str, Any]]) -> str:
    """The text of a response's message items."""
    return "".join(
        part.get("text", "")
        for item in output
        if item.get("type") == "message"
        for part in item.get("content", [])
    )


def text_events(assembler: OutputAssembler, pieces: list[str]) -> list[dict[str, Any]]:
    """The output events an assembler emits for text pieces, as the runner logs them."""
    return [event for piece in pieces for event in assembler.feed(TextDelta(piece))]


def tiny_pdf(text: str) -> bytes:
    """A one-page PDF showing ``text`` in Helvetica (made with pypdf)."""
    import io

    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    page = writer.add_blank_page(width=612, height=792)
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    fonts = DictionaryObject({NameObject("/F1"): writer._add_object(font)})
    page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): fonts})
    stream = DecodedStreamObject()
    escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    stream.set_data(f"BT /F1 12 Tf 72 712 Td ({escaped}) Tj ET".encode("latin-1"))
    page[NameObject("/Contents")] = writer._add_object(stream)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def raw_request(port: int, head: bytes, timeout: float = 30) -> bytes:
    """Send ``head`` as is on a fresh connection to ``127.0.0.1:port`` and read the
    whole answer (the server may answer and close before it has read everything: the
    write then fails, and the answer is there)."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(head)
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    return answer


def status_of(answer: bytes) -> int:
    """The status of a raw HTTP/1.1 answer (0 when there is none)."""
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def rss_mib(pid: int) -> float:
    """A process's resident memory, in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024
