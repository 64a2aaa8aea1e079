"""A remote model's durability against a real upstream (``llama-server`` on loopback,
:mod:`tests.upstream`): an upstream killed (``kill -9``) mid-generation is an engine
crash, handled per ``on_restart`` — ``fail`` keeps the committed text and names the
upstream, ``resume`` continues by token ids once the upstream is back and ends with the
uninterrupted greedy answer, ``retry`` starts over with a reset event; ``kill -9`` of
lmsp itself recovers as for a local model; a cancel closes the upstream's stream and
frees its slot. What an upstream's grammars allow and refuse: ``tests/test_remote_gbnf.py``."""

from __future__ import annotations

import time

import pytest

from tests import remote_fixtures
from tests.helpers import Server
from tests.remote_fixtures import (
    final,
    greedy_text,
    output_text,
    task_events,
    under_way,
)
from tests.upstream import Upstream

# the fixtures every remote-engine test takes
lmsp = remote_fixtures.lmsp
upstream = remote_fixtures.upstream

pytestmark = pytest.mark.slow


def test_an_upstream_killed_mid_generation_under_fail_fails_naming_it_and_keeps_the_text(
    lmsp: Server, upstream: Upstream
) -> None:
    with lmsp.client(timeout=300) as http:
        rid = under_way(http, upstream, "fail")
        upstream.kill()
        done = final(http, rid)
        upstream.start()
        expected = greedy_text(upstream)
    assert done["status"] == "failed", done
    assert done["error"]["code"] == "engine_crashed"
    assert upstream.url in done["error"]["message"]
    kept = output_text(done)
    assert kept and expected.startswith(kept) and len(kept) < len(expected)  # cut mid-answer


def test_an_upstream_killed_mid_generation_under_resume_ends_with_the_greedy_answer(
    lmsp: Server, upstream: Upstream
) -> None:
    with lmsp.client(timeout=300) as http:
        rid = under_way(http, upstream, "resume")
        upstream.kill()
        time.sleep(1.0)  # the engine sees its upstream gone and waits for it
        upstream.start()
        done = final(http, rid)
        expected = greedy_text(upstream)
    assert done["status"] in ("completed", "incomplete"), done
    assert output_text(done) == expected
    events = task_events(lmsp, rid)
    resumed = [e for e in events if e["type"] == "response.in_progress" and e.get("resumed")]
    assert resumed, "the task was not resumed: the kill came too late"


def test_an_upstream_killed_mid_generation_under_retry_resets_then_completes(
    lmsp: Server, upstream: Upstream
) -> None:
    with lmsp.client(timeout=300) as http:
        rid = under_way(http, upstream, "retry")
        upstream.kill()
        time.sleep(1.0)
        upstream.start()
        done = final(http, rid)
        expected = greedy_text(upstream)
    assert done["status"] in ("completed", "incomplete"), done
    assert output_text(done) == expected
    events = task_events(lmsp, rid)
    assert any(e.get("reset") for e in events), [e["type"] for e in events]


def test_lmsp_killed_mid_generation_on_a_remote_model_resumes_per_policy(
    lmsp: Server, upstream: Upstream
) -> None:
    with lmsp.client(timeout=300) as http:
        rid = under_way(http, upstream, "resume")
    lmsp.kill()
    lmsp.start()
    with lmsp.client(timeout=300) as http:
        done = final(http, rid)
    assert done["status"] in ("completed", "incomplete"), done
    assert output_text(done) == greedy_text(upstream)


def test_a_cancel_closes_the_upstream_stream_and_frees_its_slot(
    lmsp: Server, upstream: Upstream
) -> None:
    with lmsp.client(timeout=300) as http:
        rid = under_way(http, upstream, "fail", tokens=1500)
        assert upstream.busy() == 1
        cancelled = http.post(f"/v1/responses/{rid}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        began = time.monotonic()
        while upstream.busy() and time.monotonic() - began < 10:
            time.sleep(0.01)
        freed = time.monotonic() - began
        assert upstream.busy() == 0  # the upstream stopped generating: its slot is free
        assert final(http, rid)["status"] == "cancelled"
    print(f"slot free {freed * 1000:.0f} ms after the cancel's answer")
