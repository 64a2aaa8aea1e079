"""The shared-work campaign (issue 30): a hostile client's embeddings and multi-file
requests, generated, against a real server with small limits, while another client's
small requests must keep being answered.

Generated: embeddings requests of any number of inputs of any length (within and past
``LMSP_EMBED_MAX_INPUTS``, ``LMSP_EMBED_MAX_TOKENS`` and ``LMSP_EMBED_REQUEST_TOKENS``),
some abandoned by their client after a random short time; requests of 1 to 12 PDFs
(ordinary, slow, bombs, damaged) under one request CPU budget. No answer may be a 5xx or
lack the section-8 shape; the engine never reports more cancels than requests abandoned;
at the end the engine and the workers are free (a small embedding and a small response
are answered) and the bystander's small requests sent meanwhile were all answered.

``make test`` runs a short pass; ``make torture`` (``LMSP_CAMPAIGN=long``) 300 of each.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests import hostile
from tests.campaigns.invariants import long_run, report
from tests.helpers import Server, tiny_pdf

pytestmark = pytest.mark.slow

PER_KIND = 300 if long_run() else 10
INTERNALS = ("panic", "backtrace", ".rs:", "Traceback", "site-packages", "pypdf")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("sharedwork-campaign") / "data",
        env={
            "LMSP_TEST_ENGINE_DELAY": "0.05",  # a batch of 8 inputs: 50 ms
            "LMSP_EMBED_MAX_INPUTS": "64",
            "LMSP_EMBED_MAX_TOKENS": "256",
            "LMSP_EMBED_REQUEST_TOKENS": "4096",
            "LMSP_FILE_CPU_TIME": "1s",
            "LMSP_REQUEST_CPU_TIME": "2s",
        },
    )
    srv.start()
    yield srv
    srv.stop()


def metric(server: Server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=60).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return 0.0


def checked(answer: httpx.Response, where: str, statuses: dict[int, int], bad: list[str]) -> None:
    statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
    if answer.status_code >= 500:
        bad.append(f"{where}: {answer.status_code} {answer.text[:200]}")
    elif answer.status_code >= 400:
        error = answer.json().get("error", {})
        if set(error) != {"type", "code", "message", "param"}:
            bad.append(f"{where}: error shape {answer.text[:200]}")
    for marker in INTERNALS:
        if marker in answer.text:
            bad.append(f"{where}: {marker!r} in the answer {answer.text[:200]}")


class Bystander:
    """Another client's small response, over and over, while the block runs."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"model": "lmsp-test", "input": "Say hi.", "max_output_tokens": 3}
        with self.server.client(timeout=600) as http:
            while not self._stop.is_set():
                self.statuses.append(http.post("/v1/responses", json=body).status_code)
                self._stop.wait(0.2)

    def __enter__(self) -> Bystander:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(600)


INPUTS = st.lists(
    st.one_of(
        st.text(min_size=1, max_size=300),
        st.lists(st.integers(min_value=0, max_value=255), min_size=1, max_size=300),
    ),
    min_size=1,
    max_size=80,
)
PDF = st.one_of(
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40).map(tiny_pdf),
    st.integers(min_value=1_000, max_value=120_000).map(hostile.tj_bomb),
    st.integers(min_value=10_000, max_value=2_000_000).map(hostile.text_bomb),
    st.integers(min_value=100, max_value=60_000).map(hostile.nested_bomb),
    st.binary(max_size=500).map(lambda noise: b"%PDF-1.4\n" + noise),
)


def files_body(pdfs: list[bytes]) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "input_text", "text": "Read them."}]
    for i, pdf in enumerate(pdfs):
        content.append(
            {"type": "input_file", "filename": f"{i}.pdf", "file_data": hostile.data_url(pdf)}
        )
    return {"model": "lmsp-test", "input": [{"role": "user", "content": content}]}


def test_shared_work_campaign(server: Server) -> None:
    statuses: dict[int, int] = {}
    bad: list[str] = []
    left = 0
    started = time.monotonic()

    @given(inputs=INPUTS, leave=st.sampled_from([None, 0.05, 0.1, 0.2, 0.4]))
    @settings(
        max_examples=PER_KIND, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def embed(inputs: list[Any], leave: float | None) -> None:
        nonlocal left
        body = {"model": "lmsp-test", "input": inputs}
        with server.client(timeout=leave or 300) as http:
            try:
                answer = http.post("/v1/embeddings", json=body)
            except httpx.ReadTimeout:
                left += 1
                return
        checked(answer, "POST /v1/embeddings", statuses, bad)

    @given(pdfs=st.lists(PDF, min_size=1, max_size=12))
    @settings(
        max_examples=PER_KIND, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def files(pdfs: list[bytes]) -> None:
        with server.client(timeout=600) as http:
            answer = http.post("/v1/responses", json=files_body(pdfs))
        checked(answer, "POST /v1/responses files", statuses, bad)

    with Bystander(server) as bystander:
        embed()
        files()
    # the engine confirmed no more cancels than requests were abandoned
    cancelled = metric(server, "lmsp_embedding_cancelled_total")
    abandoned = metric(server, "lmsp_embedding_abandoned_total")
    if cancelled > abandoned:
        bad.append(f"{cancelled} cancels confirmed for {abandoned} requests abandoned")
    with server.client(timeout=600) as http:  # the engine and the workers are free
        after = http.post("/v1/embeddings", json={"model": "lmsp-test", "input": ["end"]})
        checked(after, "POST /v1/embeddings after", statuses, bad)
        small = http.post(
            "/v1/responses", json=files_body([tiny_pdf("The end.")]) | {"max_output_tokens": 3}
        )
        checked(small, "POST /v1/responses after", statuses, bad)
    if after.status_code != 200 or small.status_code != 200:
        bad.append(f"after the campaign: embeddings {after.status_code}, files {small.status_code}")
    if set(bystander.statuses) != {200}:
        bad.append(f"the bystander's answers: {sorted(set(bystander.statuses))}")
    report(
        f"shared-work campaign: {sum(statuses.values())} requests in"
        f" {time.monotonic() - started:.0f}s (statuses {dict(sorted(statuses.items()))});"
        f" {left} abandoned by the client, {abandoned:.0f} seen gone by the server,"
        f" {cancelled:.0f} cancelled in the engine; the bystander's {len(bystander.statuses)}"
        f" small responses all answered: {set(bystander.statuses) == {200}};"
        f" {len(bad)} violations"
    )
    assert not bad, bad[:10]
