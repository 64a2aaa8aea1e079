"""A remote model with two upstream replicas (two ``llama-server`` on loopback,
:mod:`tests.upstream`): sequences spread over both when they run together, an agent's
turns (a prompt that starts as the last one did) land where that prefix is cached, and
a replica killed mid-generation is an engine crash after which the task resumes on the
one left, with the uninterrupted greedy answer."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmsp.engines.remote import affinity
from tests.helpers import Server
from tests.remote_fixtures import (
    MODEL,
    add,
    decoded,
    final,
    greedy_text,
    output_text,
    prompt_tokens,
    serve,
    under_way,
    upstreams,
)
from tests.upstream import Upstream

pytestmark = pytest.mark.slow


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[list[Upstream]]:
    yield from upstreams(tmp_path, 2)


@pytest.fixture
def lmsp(tmp_path: Path, blob_cache: Path) -> Iterator[Server]:
    yield from serve(tmp_path, blob_cache, parallel=4)


def predicted(upstream: Upstream) -> int:
    text = httpx.get(f"{upstream.url}/metrics", timeout=30).text
    found = re.search(r"^llamacpp:tokens_predicted_total (\d+)", text, re.M)
    assert found, text[:500]
    return int(found.group(1))


def ask(http: httpx.Client, text: str, **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "input": text, "temperature": 0, "max_output_tokens": 16, **extra}
    answer = http.post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    done: dict[str, Any] = answer.json()
    return done


def test_sequences_spread_over_replicas_and_a_prefix_returns_to_its_replica(
    lmsp: Server, pair: list[Upstream]
) -> None:
    a, b = pair
    with lmsp.client(timeout=300) as http:
        added = add(http, a, replicas=[b.url], inflight=4)
        urls = (a.url, b.url)
        assert added["remote"]["replicas"] == [b.url]
        assert added["remote"]["capabilities"]["slots"] == 4
        before = (predicted(a), predicted(b))
        subjects = ["a lighthouse", "a harbour", "a storm", "a gull"]
        answers: dict[str, dict[str, Any]] = {}

        def one(subject: str) -> None:
            answers[subject] = ask(http, f"Write a sentence about {subject}.")

        threads = [threading.Thread(target=one, args=(s,)) for s in subjects]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        after = (predicted(a), predicted(b))
        assert after[0] > before[0] and after[1] > before[1], (before, after)
        for subject, done in answers.items():
            text = f"Write a sentence about {subject}."
            assert output_text(done) == decoded(a.greedy(prompt_tokens(text), 16))
        # an agent's turns, one at a time (equal loads): the replica its prefix hashes to,
        # the second one here (least-loaded alone would pick the first, on a tie)
        system = next(
            text
            for n in range(100)
            if affinity(prompt_tokens(text := f"Keeper {n}: answer briefly. " * 3), urls) == b.url
        )
        before = (predicted(a), predicted(b))
        first = ask(http, system + "What do you do at dusk?")
        again = ask(http, system + "What do you do at dusk? And at dawn?")
        after = (predicted(a), predicted(b))
    assert first["status"] in ("completed", "incomplete"), first
    assert after[0] == before[0] and after[1] > before[1], (before, after)
    assert again["usage"]["input_tokens_details"]["cached_tokens"] >= 16, again["usage"]


def test_a_replica_killed_mid_generation_resumes_on_the_other(
    lmsp: Server, pair: list[Upstream]
) -> None:
    a, b = pair
    with lmsp.client(timeout=300) as http:
        rid = under_way(http, a, "resume", replicas=[b.url], inflight=4)
        busy = a if a.busy() else b
        other = b if busy is a else a
        busy.kill()
        time.sleep(0.5)
        done = final(http, rid)
        expected = greedy_text(other)
    assert done["status"] in ("completed", "incomplete"), done
    assert output_text(done) == expected


def test_a_replica_down_when_the_engine_started_takes_sequences_once_it_answers(
    lmsp: Server, pair: list[Upstream]
) -> None:
    """The engine starts while one replica is down: it serves from the other, and once
    the down one answers again (it is asked every few seconds) sequences go to it too,
    without waiting for the engine's next start."""
    a, b = pair
    with lmsp.client(timeout=300) as http:
        add(http, a, replicas=[b.url], inflight=4)
        b.kill()
        first = ask(http, "Say hello.")  # the engine starts now, with a alone
        assert first["status"] in ("completed", "incomplete"), first
        b.start()
        took = 0
        deadline = time.monotonic() + 60
        subjects = iter(range(1000))
        while predicted(b) == 0 and time.monotonic() < deadline:
            took += 1
            done = ask(http, f"Name a colour, number {next(subjects)}.", max_output_tokens=4)
            assert done["status"] in ("completed", "incomplete"), done
            time.sleep(0.3)
        answered = predicted(b)
    assert answered > 0, f"replica b took no sequence in 60 s ({took} asked)"
