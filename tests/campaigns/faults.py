"""The faults campaign: writes that fail as a full disk fails them, then a real full disk.

Part one runs the real app under uvicorn in this process and arms the writer's test
seam (:class:`lmsp.store.db.Faults`) run after run: fail the N-th job (N = 1, 2, …, 8
and again), the N-th commit, or every write for a moment (a disk that stays full), each
under a burst of mixed load (background, synchronous and streamed requests, keyed
requests and their retries, cancels). Part two (as root) mounts a small tmpfs, puts a
real server's data directory on it, fills the filesystem mid-load and frees it again.

Every run ends with the invariants of :mod:`tests.campaigns.invariants` and the
service serving again: ``/healthz`` ok and a new request answered. Any ``5xx`` other
than ``507 insufficient_storage`` is a violation, and so is a request refused with
``507`` that left anything behind.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from lmsp.api.app import create_app
from lmsp.app.service import Service
from lmsp.config import Settings
from lmsp.store.db import Faults
from tests.helpers import Server, free_port

from .invariants import Ledger, Witness, check, wait_all_finished
from .smallfs import can_mount, fill, seed_by_symlink, small_fs


@dataclass
class Figures:
    runs: int = 0
    injected: int = 0
    requests: int = 0
    refused_507: int = 0
    accepted: int = 0
    fs_episodes: int = 0
    fs_refused_507: int = 0
    fs_skipped: str | None = None
    violations: list[str] = field(default_factory=list)


class InProcess:
    """The real app under uvicorn in a thread of this process (so a test reaches its
    database's fault seam)."""

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.app = create_app(settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.token = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def svc(self) -> Service:
        svc: Service = self.app.state.lmsp
        return svc

    def __enter__(self) -> InProcess:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the in-process server did not start")
            time.sleep(0.02)
        self.token = (self.svc.settings.owner_token_path).read_text().strip()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)

    def client(self, timeout: float = 30) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=timeout
        )


class Burst:
    """Mixed requests for a while; answers sorted into the ledger and the figures."""

    def __init__(
        self, url: str, token: str, ledger: Ledger, rng: random.Random, pad: int = 0
    ) -> None:
        # bigger requests (metadata: the prompt must fit the context): the WAL has to grow
        self.pad = {f"pad{i}": "." * 500 for i in range(min(16, pad // 500))}
        self.url = url
        self.token = token
        self.ledger = ledger
        self.rng = random.Random(rng.random())
        self.lock = threading.Lock()
        self.requests = 0
        self.refused = 0
        self.accepted = 0
        self.violations: list[str] = []
        self.refused_keys: list[tuple[str, dict[str, Any]]] = []

    def _answer(self, answer: httpx.Response, body: dict[str, Any], key: str | None) -> None:
        with self.lock:
            self.requests += 1
        if answer.status_code == 507:
            if answer.json()["error"]["code"] != "insufficient_storage":
                self.violations.append(f"507 with {answer.text[:100]}")
            self.ledger.refuse(body)
            with self.lock:
                self.refused += 1
                if key is not None:
                    self.refused_keys.append((key, body))
        elif answer.status_code >= 500:
            self.violations.append(
                f"{answer.status_code} {answer.request.url.path}: {answer.text[:150]}"
            )
        elif answer.status_code in (200, 202) and "json" in answer.headers.get("content-type", ""):
            self.ledger.accept(answer.json(), body, key)
            with self.lock:
                self.accepted += 1

    def one(self, http: httpx.Client, n: int) -> None:
        pick = self.rng.random()
        body: dict[str, Any] = {
            "model": "lmsp-test",
            "input": f"fault {n} {self.rng.random()}",
            "on_restart": self.rng.choice(("fail", "retry", "resume")),
        }
        if self.pad:
            body["metadata"] = self.pad
        key = f"f-{self.rng.getrandbits(64):x}" if self.rng.random() < 0.3 else None
        headers = {"Idempotency-Key": key} if key else {}
        if pick < 0.55:
            body["background"] = True
            answer = http.post("/v1/responses", json=body, headers=headers)
            self._answer(answer, body, key)
            if key and answer.status_code == 202 and self.rng.random() < 0.5:
                again = http.post("/v1/responses", json=body, headers=headers)
                if again.status_code == 202 and again.json()["id"] != answer.json()["id"]:
                    self.violations.append(f"key {key} made a second response")
        elif pick < 0.7:
            self._answer(http.post("/v1/responses", json=body, headers=headers), body, key)
        elif pick < 0.85:
            body["stream"] = True
            with http.stream("POST", "/v1/responses", json=body) as answer:
                if answer.status_code != 200:
                    answer.read()
                    self._answer(answer, body, None)
                    return
                with self.lock:
                    self.requests += 1
                for line in answer.iter_lines():
                    if line.startswith("data:"):
                        self.ledger.accept(json.loads(line[5:])["response"], body, None)
                        with self.lock:
                            self.accepted += 1
                        break
        else:
            with self.ledger.lock:
                targets = list(self.ledger.accepted.values())
            if targets:
                target = self.rng.choice(targets)
                answer = http.post(f"/v1/responses/{target.response_id}/cancel")
                with self.lock:
                    self.requests += 1
                if answer.status_code >= 500 and answer.status_code != 507:
                    self.violations.append(f"cancel: {answer.status_code} {answer.text[:100]}")

    def run(self, seconds: float, threads: int = 3) -> None:
        stop = time.monotonic() + seconds

        def loop(slot: int) -> None:
            with httpx.Client(
                base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60
            ) as http:
                n = 0
                while time.monotonic() < stop:
                    n += 1
                    try:
                        self.one(http, slot * 100_000 + n)
                    except httpx.HTTPError as exc:
                        self.violations.append(f"transport: {exc!r}")
                        return
                    except Exception as exc:
                        self.violations.append(f"load: {exc!r}")
                        return

        workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)


def serving_again(url: str, token: str) -> list[str]:
    """``/healthz`` ok again (waited for) and a new request answered."""
    deadline = time.monotonic() + 30
    while httpx.get(f"{url}/healthz", timeout=10).status_code != 200:
        if time.monotonic() > deadline:
            return ["/healthz did not come back"]
        time.sleep(0.05)
    answer = httpx.post(
        f"{url}/v1/responses",
        json={"model": "lmsp-test", "input": "serving again?"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    if answer.status_code != 200 or answer.json()["status"] != "completed":
        return [f"not serving again: {answer.status_code} {answer.text[:100]}"]
    return []


def retry_refused_keys(url: str, token: str, burst: Burst, ledger: Ledger) -> list[str]:
    """A keyed request refused with 507 is sent again once space is back: it creates
    its response now, once."""
    found = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as h:
        for key, body in burst.refused_keys:
            answer = h.post("/v1/responses", json=body, headers={"Idempotency-Key": key})
            if answer.status_code >= 500:
                found.append(f"retry of a refused key: {answer.status_code}")
            elif answer.status_code in (200, 202):
                with ledger.lock:
                    ledger.refused_inputs.discard(str(body["input"]))
                ledger.accept(answer.json(), body, key)
    return found


def seam_runs(settings: Settings, runs: int, seed: int, figs: Figures) -> None:
    rng = random.Random(seed)
    ledger = Ledger()
    with InProcess(settings) as server:
        db = server.svc.db
        for n in range(runs):
            nth = n % 8 + 1
            mode = ("job", "commit", "window")[n % 3]
            faults = Faults()
            if mode == "job":
                faults.jobs = {nth, nth + 5}
            elif mode == "commit":
                faults.commits = {nth}
            burst = Burst(server.url, server.token, ledger, rng)
            db.faults = faults
            if mode == "window":
                timer = threading.Timer(
                    0.05 + 0.05 * nth, lambda f=faults: setattr(f, "all_writes", True)
                )
                undo = threading.Timer(
                    0.35 + 0.05 * nth, lambda f=faults: setattr(f, "all_writes", False)
                )
                timer.start()
                undo.start()
                burst.run(0.6)
                timer.join()
                undo.join()
            else:
                burst.run(0.3)
            db.faults = None
            figs.runs += 1
            figs.injected += faults.injected
            figs.requests += burst.requests
            figs.refused_507 += burst.refused
            figs.accepted += burst.accepted
            figs.violations += [f"run {n} ({mode} {nth}): {v}" for v in burst.violations]
            figs.violations += retry_refused_keys(server.url, server.token, burst, ledger)
            if not wait_all_finished(settings.data_dir, 60):
                figs.violations.append(f"run {n} ({mode} {nth}): tasks stuck unfinished")
            figs.violations += [f"run {n}: {v}" for v in check(settings.data_dir, ledger)]
            figs.violations += [f"run {n}: {v}" for v in serving_again(server.url, server.token)]


def filesystem_runs(base: Path, blob_cache: Path, episodes: int, seed: int, figs: Figures) -> None:
    reason = can_mount()
    if reason is not None:
        figs.fs_skipped = reason
        return
    rng = random.Random(seed)
    ledger = Ledger()
    with small_fs(base / "small", 48) as mount:
        data_dir = seed_by_symlink(mount / "data", blob_cache)
        # retention keeps the database small, so that freeing the filler frees the disk
        # (the witness checks each task before it is swept)
        env = {"LMSP_TEST_ENGINE_DELAY": "0.01", "LMSP_PARALLEL": "2"}
        env.update(LMSP_RETENTION="2s", LMSP_GC_INTERVAL="0.5s")
        server = Server(data_dir, env=env)
        server.log_path = base / "fs-server.log"
        server.start()
        witness = Witness(data_dir, ledger)
        witness.start()
        try:
            for n in range(episodes):
                burst = Burst(server.url, server.token, ledger, rng, pad=8_000)
                filler = mount / "filler"
                health: list[int] = []

                def full_then_free(
                    filler: Path = filler,
                    health: list[int] = health,
                    burst: Burst = burst,
                    n: int = n,
                ) -> None:
                    time.sleep(0.3)
                    fill(filler)
                    with server.client() as http:  # write until the WAL cannot grow
                        for i in range(300):
                            body = {"model": "lmsp-test", "input": f"push {n} {i}"}
                            body.update(background=True, metadata=burst.pad)
                            answer = http.post("/v1/responses", json=body)
                            burst._answer(answer, body, None)
                            if answer.status_code != 202:
                                break
                    health.append(httpx.get(f"{server.url}/healthz", timeout=10).status_code)
                    time.sleep(0.5)  # the load runs on a full disk
                    filler.unlink()  # space is back: waiting requests must now finish

                episode = threading.Thread(target=full_then_free)
                episode.start()
                burst.run(2.0)
                episode.join()
                degraded = health[0]
                figs.fs_episodes += 1
                figs.requests += burst.requests
                figs.fs_refused_507 += burst.refused
                figs.accepted += burst.accepted
                figs.violations += [f"fs {n}: {v}" for v in burst.violations]
                if degraded not in (200, 503):
                    figs.violations.append(f"fs {n}: /healthz answered {degraded}")
                figs.violations += retry_refused_keys(server.url, server.token, burst, ledger)
                if not wait_all_finished(data_dir, 90):
                    figs.violations.append(f"fs {n}: tasks stuck unfinished after space came back")
                figs.violations += [f"fs {n}: {v}" for v in check(data_dir, ledger)]
                figs.violations += [f"fs {n}: {v}" for v in serving_again(server.url, server.token)]
            server.stop()
        finally:
            witness.stop.set()
            witness.join(10)
            figs.violations += witness.violations
            server.kill()


def summary(figs: Figures, seconds: float) -> str:
    fs = (
        f"{figs.fs_episodes} real full-disk episodes on a tmpfs"
        f" ({figs.fs_refused_507} answered 507)"
        if figs.fs_skipped is None
        else f"real full disk skipped: {figs.fs_skipped}"
    )
    return (
        f"faults campaign: {figs.runs} runs, {figs.injected} writes failed on purpose (N-th job,"
        f" N-th commit, full-disk windows) and {fs}, in {seconds:.0f}s; {figs.requests}"
        f" requests, {figs.accepted} accepted, {figs.refused_507} refused with 507;"
        f" {len(figs.violations)} violations"
    )
