"""The crash campaign: ``kill -9`` at random moments under a mixed load, again and again.

Each round starts two would-be servers on the same data directory at once (exactly one
may win; the other must refuse and change nothing), runs a mixed load — background
requests of every ``on_restart`` policy, streams read part-way or to the end, cancels,
requests with an ``Idempotency-Key`` retried (also across the crash), model imports,
deletes, and retention sweeps running every half second — and sends ``SIGKILL`` at a
random moment. After each kill and each restart it checks: every accepted request
exists (or was seen finished before retention swept it, or was deleted on purpose),
every log is gap-free from 0 with one terminal event, the deltas equal the output,
11.3 was applied to what was left unfinished, no key made two responses, and
``PRAGMA integrity_check`` is ok.
"""

from __future__ import annotations

import json
import random
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import Server, children, free_ports, seeded_data_dir, wait_exited

from .invariants import (
    Ledger,
    Witness,
    check,
    open_ro,
    recovery_violations,
    unfinished,
    wait_all_finished,
)

POLICIES = ("fail", "retry", "resume")
MAX_BACKLOG = 12  # unfinished requests the load keeps at most
ENV = {
    "LMSP_TEST_ENGINE_DELAY": "0.01",
    "LMSP_PARALLEL": "2",
    "LMSP_RETENTION": "5s",
    "LMSP_GC_INTERVAL": "0.5s",
}


def tiny_gguf(path: Path, name: str) -> Path:
    """A whole, valid GGUF of one small F32 tensor (imports; never loaded)."""

    def string(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 2)
    head += string("general.architecture") + struct.pack("<I", 8) + string("llama")
    head += string("general.name") + struct.pack("<I", 8) + string(name)
    head += string("t") + struct.pack("<I", 1) + struct.pack("<Q", 16)
    head += struct.pack("<I", 0) + struct.pack("<Q", 0)
    head += b"\0" * (-len(head) % 32)
    path.write_bytes(head + b"\0" * 64)
    return path


@dataclass
class Figures:
    kills: int = 0
    races: int = 0
    race_refusals: int = 0
    accepted: int = 0
    streams: int = 0
    disconnects: int = 0
    cancels: int = 0
    key_retries: int = 0
    keys_retried_after_crash: int = 0
    imports: int = 0
    deletes: int = 0
    swept: int = 0
    witnessed: int = 0
    engines: int = 0  # processes of a killed server (its engines) seen to exit after it
    cells: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


class Load:
    """Client threads against one server until ``stop`` or the server dies."""

    def __init__(self, server: Server, ledger: Ledger, rng: random.Random, figs: Figures) -> None:
        self.server = server
        self.ledger = ledger
        self.rng = random.Random(rng.random())
        self.figs = figs
        self.stop = threading.Event()
        self.pending_keys: list[tuple[str, dict[str, Any]]] = []
        self.counter = 0
        self.lock = threading.Lock()
        self.tmp = server.data_dir.parent / "imports"
        self.tmp.mkdir(exist_ok=True)

    def _body(self, **extra: Any) -> dict[str, Any]:
        with self.lock:
            self.counter += 1
            n = self.counter
        return {
            "model": "lmsp-test",
            "input": f"crash {self.server.port} {n} {self.rng.random()}",
            "seed": self.rng.randrange(1, 2**31),
            "on_restart": self.rng.choice(POLICIES),
            **extra,
        }

    def _violation(self, text: str) -> None:
        with self.lock:
            self.figs.violations.append(text)

    def _check(self, answer: httpx.Response, *ok: int) -> bool:
        if answer.status_code >= 500:
            self._violation(
                f"{answer.request.method} {answer.request.url.path}: {answer.text[:200]}"
            )
        return answer.status_code in ok

    def backlog(self) -> int:
        with self.ledger.lock:
            return len(self.ledger.accepted) - len(self.ledger.seen_finished)

    def create(
        self, http: httpx.Client, key: str | None = None, body: dict[str, Any] | None = None
    ) -> None:
        body = body or self._body(background=True)
        headers = {"Idempotency-Key": key} if key else {}
        try:
            answer = http.post("/v1/responses", json=body, headers=headers)
        except httpx.TransportError:
            if key is not None:
                with self.lock:
                    self.pending_keys.append((key, body))
            raise
        if self._check(answer, 202):
            self.ledger.accept(answer.json(), body, key)
            with self.lock:
                self.figs.accepted += 1
            if key is not None and self.rng.random() < 0.4:
                again = http.post("/v1/responses", json=body, headers=headers)
                if self._check(again, 202):
                    with self.lock:
                        self.figs.key_retries += 1
                    if again.json()["id"] != answer.json()["id"]:
                        self._violation(f"key {key}: a retry made another response")
                    self.ledger.accept(again.json(), body, key)

    def stream(self, http: httpx.Client) -> None:
        background = self.rng.random() < 0.5
        body = self._body(stream=True, background=background)
        read_all = self.rng.random() < 0.5
        with http.stream("POST", "/v1/responses", json=body) as answer:
            if not self._check(answer, 200):
                return
            first = None
            for n, line in enumerate(answer.iter_lines()):
                if line.startswith("data:") and first is None:
                    first = json.loads(line[5:])
                    obj = first["response"]
                    self.ledger.accept(obj, body, None)
                    with self.lock:
                        self.figs.accepted += 1
                        self.figs.streams += 1
                if not read_all and n > 12:
                    with self.lock:
                        self.figs.disconnects += 1
                    break

    def cancel(self, http: httpx.Client) -> None:
        with self.ledger.lock:
            if not self.ledger.accepted:
                return
            target = self.rng.choice(list(self.ledger.accepted.values()))
        answer = http.post(f"/v1/responses/{target.response_id}/cancel")
        if self._check(answer, 200, 404):
            with self.lock:
                self.figs.cancels += 1

    def delete(self, http: httpx.Client) -> None:
        with self.ledger.lock:
            done = [
                a for a in self.ledger.accepted.values() if a.task_id in self.ledger.seen_finished
            ]
        if not done:
            return
        target = self.rng.choice(done)
        answer = http.delete(f"/v1/responses/{target.response_id}")
        if self._check(answer, 200, 404) and answer.status_code == 200:
            with self.ledger.lock:
                self.ledger.deleted.add(target.response_id)
            with self.lock:
                self.figs.deletes += 1

    def import_model(self, http: httpx.Client) -> None:
        with self.lock:
            self.counter += 1
            n = self.counter
        path = tiny_gguf(self.tmp / f"m{n}.gguf", f"campaign-{n}-{self.rng.random()}")
        answer = http.post("/v1/models", json={"id": f"imp-{n}", "path": str(path)})
        if self._check(answer, 201):
            with self.lock:
                self.figs.imports += 1
            if self.rng.random() < 0.5:
                self._check(http.delete(f"/v1/models/imp-{n}"), 200)

    def worker(self, role: str) -> None:
        with self.server.client(timeout=30) as http:
            while not self.stop.is_set():
                try:
                    if role in ("post", "stream") and self.backlog() > MAX_BACKLOG:
                        time.sleep(0.05)  # the queue is long enough: let it drain
                    elif role == "post":
                        key = f"k-{self.rng.getrandbits(64):x}" if self.rng.random() < 0.4 else None
                        self.create(http, key)
                    elif role == "stream":
                        self.stream(http)
                    elif role == "misc":
                        pick = self.rng.random()
                        if pick < 0.5:
                            self.cancel(http)
                        elif pick < 0.75:
                            self.delete(http)
                        else:
                            self.import_model(http)
                    time.sleep(self.rng.random() * 0.05)
                except (httpx.TransportError, httpx.StreamError):
                    return  # the server is gone
                except Exception as exc:  # a bug of the load itself counts too
                    self._violation(f"load {role}: {exc!r}")
                    return

    def run_for(self, seconds: float, kill: Any) -> None:
        threads = [
            threading.Thread(target=self.worker, args=(role,), daemon=True)
            for role in ("post", "post", "stream", "misc")
        ]
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        kill()
        self.stop.set()
        for thread in threads:
            thread.join(60)


def race(data_dir: Path, log_dir: Path, figs: Figures, alone: bool = False) -> Server:
    """Two servers on one directory at once: exactly one serves; the other refuses.
    (``alone``: one server, no race.)"""
    pair = [Server(data_dir, env=ENV)] + ([] if alone else [Server(data_dir, env=ENV)])
    # distinct ports: with one port for both, the refused one's probe would reach the
    # other, and the server that serves would be taken for the loser
    for n, (srv, port) in enumerate(zip(pair, free_ports(len(pair)), strict=True)):
        srv.log_path = log_dir / f"server-{n}.log"
        srv.port = port
        srv.launch()
    deadline = time.monotonic() + 120
    winner: Server | None = None
    while winner is None and time.monotonic() < deadline:
        for srv in pair:
            try:
                if httpx.get(f"{srv.url}/healthz", timeout=1).status_code == 200:
                    winner = srv
                    break
            except httpx.HTTPError:
                pass
        time.sleep(0.05)
    if winner is None:
        for srv in pair:
            srv.kill()
        raise RuntimeError("no server of the race came up")
    if alone:
        return winner
    loser = pair[1] if winner is pair[0] else pair[0]
    assert loser.proc is not None
    try:
        code = loser.proc.wait(60)
    except Exception:
        code = None
    figs.races += 1
    said = loser.log_path.read_text(errors="replace").strip().splitlines()
    if code == 1 and said and "in use by another lmsp process" in said[-1]:
        figs.race_refusals += 1
    else:
        figs.violations.append(f"race: the loser exited {code}: {said[-1:] if said else ''}")
        loser.kill()
    loser.proc = None
    return winner


def retry_pending_keys(server: Server, load: Load, figs: Figures) -> None:
    """Keyed requests a kill cut off: sent again with their key, after the restart."""
    with server.client(timeout=30) as http:
        for key, body in load.pending_keys:
            answer = http.post("/v1/responses", json=body, headers={"Idempotency-Key": key})
            if answer.status_code >= 500:
                figs.violations.append(f"retry of {key}: {answer.status_code}")
            elif answer.status_code == 202:
                load.ledger.accept(answer.json(), body, key)
                figs.keys_retried_after_crash += 1


def kill(server: Server, figs: Figures) -> None:
    """``kill -9`` the server; every process it had started (its engine processes)
    must exit after it: none outlives the service."""
    started = children(server.proc.pid) if server.proc is not None else []
    server.kill()
    for pid in started:
        figs.engines += 1
        if not wait_exited(pid, 15):
            figs.violations.append(f"process {pid} of a killed server outlived it")


def run(base: Path, blob_cache: Path, kills: int, seed: int, race_every: int = 1) -> Figures:
    """``kills`` rounds; every ``race_every``-th restart is a race of two servers."""
    rng = random.Random(seed)
    figs = Figures()
    data_dir = seeded_data_dir(base / "data", blob_cache)
    ledger = Ledger()
    witness = Witness(data_dir, ledger)
    witness.start()
    leftovers: list[Any] = []
    server: Server | None = None
    try:
        for round_ in range(kills):
            server = race(data_dir, base, figs, alone=round_ % race_every != 0)
            found, cells = recovery_violations(data_dir, leftovers)
            figs.violations += found
            for cell, n in cells.items():
                figs.cells[cell] = figs.cells.get(cell, 0) + n
            load = Load(server, ledger, rng, figs)
            if leftovers and figs.kills % 3 == 0:
                time.sleep(0.3)  # let some recovered tasks run before the load starts
            load.run_for(rng.uniform(0.15, 1.5), lambda s=server: kill(s, figs))
            figs.kills += 1
            leftovers = unfinished(data_dir)
            figs.violations += check(data_dir, ledger)
            if load.pending_keys:
                server = race(data_dir, base, figs)
                figs.violations += recovery_violations(data_dir, leftovers)[0]
                retry_pending_keys(server, load, figs)
                server.stop()
                leftovers = unfinished(data_dir)
        server = race(data_dir, base, figs)
        figs.violations += recovery_violations(data_dir, leftovers)[0]
        if not wait_all_finished(data_dir):
            figs.violations.append("tasks left unfinished at the end")
        server.stop()
        server = None
        time.sleep(0.3)
        figs.violations += check(data_dir, ledger)
    finally:
        witness.stop.set()
        witness.join(10)
        if server is not None:
            server.kill()
    figs.violations += witness.violations
    figs.witnessed = witness.checked
    conn = open_ro(data_dir)
    try:
        present = {r[0] for r in conn.execute("SELECT id FROM tasks")}
    finally:
        conn.close()
    gone = [a for a in ledger.accepted.values() if a.task_id not in present]
    figs.swept = len([a for a in gone if a.response_id not in ledger.deleted])
    return figs


def summary(figs: Figures, seconds: float) -> str:
    cells = ", ".join(f"{k} {v}" for k, v in sorted(figs.cells.items()))
    return (
        f"crash campaign: {figs.kills} kills (SIGKILL) in {seconds:.0f}s; {figs.accepted} requests"
        f" accepted, {figs.streams} streams ({figs.disconnects} cut), {figs.cancels} cancels,"
        f" {figs.key_retries} key retries (+{figs.keys_retried_after_crash} across a crash),"
        f" {figs.imports} imports, {figs.deletes} deletes, {figs.swept} swept by retention;"
        f" {figs.races} races for the directory ({figs.race_refusals} losers refused);"
        f" {figs.engines} engine processes ended after their server;"
        f" recovery: {cells}; {len(figs.violations)} violations"
    )
