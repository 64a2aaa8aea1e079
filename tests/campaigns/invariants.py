"""What every campaign checks of a data directory, as a list of violations (never an
assertion at the first one: a campaign reports all it found, then fails if any).

The ledger is the client side's memory: what was accepted (every ``202``/``200``),
what was refused for a full disk (must not exist), which response each idempotency key
produced (one only), what was deleted on purpose and which tasks were seen finished
(retention may sweep those). The database is read directly, on real SQLite files.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
FINISHED = ("completed", "failed", "cancelled")
UNFINISHED = ("queued", "loading", "running", "cancelling")

FIGURES: list[str] = []  # printed at the end of the pytest run (tests/conftest.py)


def long_run() -> bool:
    return os.environ.get("LMSP_CAMPAIGN", "short") == "long"


def report(line: str) -> None:
    FIGURES.append(line)
    print(line, flush=True)


@dataclass
class Accepted:
    response_id: str
    task_id: str
    body: dict[str, Any]
    key: str | None = None


@dataclass
class Ledger:
    """The client side's record of one data directory."""

    accepted: dict[str, Accepted] = field(default_factory=dict)  # by task id
    refused_inputs: set[str] = field(default_factory=set)  # refused (507, 409): nothing may exist
    keys: dict[str, set[str]] = field(default_factory=dict)  # key → response ids
    key_inputs: dict[str, str] = field(default_factory=dict)  # key → its unique input
    deleted: set[str] = field(default_factory=set)  # response ids deleted on purpose
    seen_finished: set[str] = field(default_factory=set)  # task ids
    lock: threading.Lock = field(default_factory=threading.Lock)

    def accept(self, obj: dict[str, Any], body: dict[str, Any], key: str | None) -> None:
        with self.lock:
            task_id = obj["task"]["id"]
            self.accepted.setdefault(task_id, Accepted(obj["id"], task_id, body, key))
            if key is not None:
                self.keys.setdefault(key, set()).add(obj["id"])
                self.key_inputs[key] = str(body["input"])

    def refuse(self, body: dict[str, Any]) -> None:
        with self.lock:
            self.refused_inputs.add(str(body["input"]))


def open_ro(data_dir: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"{(data_dir / 'lmsp.db').as_uri()}?mode=ro", uri=True, timeout=30)
    conn.row_factory = sqlite3.Row
    return conn


def log_of(conn: sqlite3.Connection, task_id: str) -> list[dict[str, Any]]:
    return [
        json.loads(r[0])
        for r in conn.execute(
            "SELECT data FROM task_events WHERE task_id = ? ORDER BY sequence_number", (task_id,)
        )
    ]


def output_text(output: Any) -> str:
    return "".join(
        part.get("text", "")
        for item in (output or [])
        if item.get("type") == "message"
        for part in item.get("content", [])
    )


def deltas_since_reset(log: list[dict[str, Any]]) -> str:
    resets = [i for i, e in enumerate(log) if e.get("reset")]
    start = resets[-1] if resets else 0
    return "".join(e["delta"] for e in log[start:] if e["type"] == "response.output_text.delta")


def task_violations(
    conn: sqlite3.Connection, task: sqlite3.Row, response: sqlite3.Row | None
) -> list[str]:
    """One task: gap-free log from 0, the row's last number, one terminal event last
    and matching the status, and (completed) deltas equal to the output text."""
    found = []
    tid = task["id"]
    log = log_of(conn, tid)
    seqs = [e["sequence_number"] for e in log]
    if seqs != list(range(len(log))):
        found.append(f"{tid}: log not gap-free from 0: {seqs[:10]}…")
    if task["last_sequence_number"] != len(log) - 1:
        found.append(
            f"{tid}: last_sequence_number {task['last_sequence_number']} != {len(log) - 1}"
        )
    terminal = [e for e in log if e["type"] in TERMINAL_EVENTS]
    if task["status"] in EVENT_FOR_STATUS:
        if len(terminal) != 1 or log[-1]["type"] not in EVENT_FOR_STATUS[task["status"]]:
            found.append(f"{tid}: {task['status']} with terminal events {len(terminal)}")
    elif terminal:
        found.append(f"{tid}: {task['status']} but a terminal event was logged")
    if task["status"] == "completed" and response is not None:
        text = output_text(json.loads(response["output"] or "[]"))
        if deltas_since_reset(log) != text:
            found.append(f"{tid}: the deltas differ from the output text")
    return found


def check(data_dir: Path, ledger: Ledger) -> list[str]:
    """Every invariant over the whole directory; the violations found."""
    found: list[str] = []
    conn = open_ro(data_dir)
    try:
        conn.execute("BEGIN")  # one snapshot for the whole check
        tasks = {r["id"]: r for r in conn.execute("SELECT * FROM tasks")}
        responses = {r["id"]: r for r in conn.execute("SELECT * FROM responses")}
        for task in tasks.values():
            found += task_violations(conn, task, responses.get(task["response_id"]))
        with ledger.lock:
            accepted = list(ledger.accepted.values())
            keys = {k: set(v) for k, v in ledger.keys.items()}
            key_inputs = dict(ledger.key_inputs)
            refused = set(ledger.refused_inputs)
            gone_ok = set(ledger.deleted)
            seen = set(ledger.seen_finished)
        for acc in accepted:
            if (
                acc.task_id not in tasks
                and acc.task_id not in seen
                and acc.response_id not in gone_ok
            ):
                found.append(f"accepted {acc.task_id} is missing (never seen finished)")
        inputs: dict[str, int] = {}
        for row in conn.execute("SELECT json_extract(request, '$.input') FROM responses"):
            if isinstance(row[0], str):
                inputs[row[0]] = inputs.get(row[0], 0) + 1
        for key, ids in keys.items():
            if len(ids) > 1:
                found.append(f"key {key} answered with {len(ids)} responses")
            if inputs.get(key_inputs[key], 0) > 1:
                found.append(f"key {key}: {inputs[key_inputs[key]]} responses for one request")
        for text in refused:
            if inputs.get(text):
                found.append(f"a refused request (507, 409) was written: {text[:40]}")
        conn.execute("COMMIT")
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        if integrity != "ok":
            found.append(f"integrity_check: {integrity}")
    finally:
        conn.close()
    return found


def unfinished(data_dir: Path) -> list[sqlite3.Row]:
    conn = open_ro(data_dir)
    try:
        return list(
            conn.execute(
                "SELECT id, status, on_restart, last_sequence_number, attempt FROM tasks"
                " WHERE status IN ('queued','loading','running','cancelling')"
            )
        )
    finally:
        conn.close()


class Witness(threading.Thread):
    """Reads the database (read-only) every ``every`` seconds while a run goes on and
    notes the tasks seen finished, checking each one's log the first time: retention
    may sweep it before the next full check."""

    def __init__(self, data_dir: Path, ledger: Ledger, every: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.data_dir = data_dir
        self.ledger = ledger
        self.every = every
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.checked = 0

    def run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                self._look()
            except sqlite3.Error:
                continue  # the file is being created or recovered: look again

    def _look(self) -> None:
        conn = open_ro(self.data_dir)
        try:
            conn.execute("BEGIN")
            with self.ledger.lock:
                seen = set(self.ledger.seen_finished)
            rows = conn.execute(
                "SELECT t.*, r.output AS r_output FROM tasks t JOIN responses r"
                " ON r.id = t.response_id WHERE t.status IN ('completed','failed','cancelled')"
            ).fetchall()
            for row in rows:
                if row["id"] in seen:
                    continue
                response = conn.execute(
                    "SELECT * FROM responses WHERE id = ?", (row["response_id"],)
                ).fetchone()
                self.violations += task_violations(conn, row, response)
                self.checked += 1
                with self.ledger.lock:
                    self.ledger.seen_finished.add(row["id"])
            conn.execute("COMMIT")
        finally:
            conn.close()


def wait_all_finished(data_dir: Path, timeout: float = 120) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not unfinished(data_dir):
            return True
        time.sleep(0.1)
    return False


# -- the 11.3 table -------------------------------------------------------------------------


def recovery_cell(status: str, policy: str) -> str:
    if status == "cancelling":
        return "cancelled"
    if policy == "fail":
        return "failed"
    if status == "queued":
        return "kept_queued"
    if status == "running" and policy == "resume":
        return "resumed"
    return "requeued_reset" if policy == "retry" else "requeued"


def recovery_violations(
    data_dir: Path, leftovers: list[sqlite3.Row]
) -> tuple[list[str], dict[str, int]]:
    """After a restart (``/healthz`` answers only once recovery ran): the first event
    after each leftover's last one is the one the table says."""
    found: list[str] = []
    cells: dict[str, int] = {}
    conn = open_ro(data_dir)
    try:
        for lo in leftovers:
            log = log_of(conn, lo["id"])
            if not log:
                continue  # swept meanwhile cannot happen to an unfinished task
            nxt = (
                log[lo["last_sequence_number"] + 1]
                if len(log) > lo["last_sequence_number"] + 1
                else None
            )
            cell = recovery_cell(lo["status"], lo["on_restart"])
            cells[cell] = cells.get(cell, 0) + 1
            kind = nxt["type"] if nxt else None
            where = f"{lo['id']} {lo['status']}/{lo['on_restart']} → {kind}"
            if (cell == "cancelled" and kind != "response.cancelled") or (
                cell == "failed"
                and (
                    kind != "response.failed"
                    or nxt is None
                    or nxt["response"]["error"]["code"] != "server_restarted"
                )
            ):
                found.append(f"11.3 {where}")
            elif cell in ("requeued", "requeued_reset"):
                if kind != "response.queued" or nxt is None:
                    found.append(f"11.3 {where}")
                elif nxt["attempt"] != lo["attempt"] + 1 or bool(nxt.get("reset")) != (
                    cell == "requeued_reset"
                ):
                    found.append(f"11.3 {where}: attempt/reset {nxt.get('attempt')}")
            elif cell == "resumed" and nxt is not None:
                if kind != "response.in_progress" or not nxt.get("resumed"):
                    found.append(f"11.3 {where}")
                resumed = [e for e in log[lo["last_sequence_number"] + 1 :] if e.get("resumed")]
                if (
                    len(resumed) > 1
                    and resumed[1]["sequence_number"] == resumed[0]["sequence_number"] + 1
                ):
                    found.append(f"{where}: resumed twice in a row (two owners?)")
            elif cell == "kept_queued" and nxt is not None and kind != "response.loading":
                found.append(f"11.3 {where}")
    finally:
        conn.close()
    return found, cells
