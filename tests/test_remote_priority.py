"""A task's ``service_tier`` on a remote model (docs/remote-engines.md): the runner hands
the tier to the engine with the task's sampling values; vLLM's ``priority`` (found when
the model was added) is sent for a tier other than ``default`` (lower first: ``priority``
-1, ``flex`` 1) and never where the upstream was not found to schedule by it;
llama-server has no priority (it ignores the field, checked here against the real one),
so lmsp sends none and its own claim order alone decides."""

from __future__ import annotations

import httpx
import pytest

from lmsp.engines.base import Sampling
from lmsp.engines.upstream import RemoteSpec, completion_body
from lmsp.protocol.request import from_stored
from lmsp.runner.plan import sampling_of
from tests import remote_fixtures
from tests.helpers import Server
from tests.remote_fixtures import MODEL, add, decoded, output_text, prompt_tokens
from tests.upstream import Upstream

# the fixtures every remote-engine test takes
lmsp = remote_fixtures.lmsp
upstream = remote_fixtures.upstream


def spec(**capabilities: object) -> RemoteSpec:
    return RemoteSpec("http://gpu:8000", "qwen", capabilities=dict(capabilities))


VLLM = {"dialect": "openai", "server": "vllm", "priority": True}


@pytest.mark.parametrize(("tier", "sent"), [(2, -1), (1, None), (0, 1)])
def test_vllm_with_priority_scheduling_gets_the_tier_lower_first(
    tier: int, sent: int | None
) -> None:
    _, body = completion_body(spec(**VLLM), [1, 2], Sampling(tier=tier), 8)
    assert body.get("priority") == sent


def test_no_priority_goes_where_the_upstream_was_not_found_to_schedule_by_it() -> None:
    for capabilities in ({**VLLM, "priority": False}, {"dialect": "llama-server"}):
        for tier in (0, 1, 2):
            _, body = completion_body(spec(**capabilities), [1, 2], Sampling(tier=tier), 8)
            assert "priority" not in body, (capabilities, tier)


@pytest.mark.parametrize(("asked", "tier"), [("priority", 2), ("flex", 0), (None, 1)])
def test_a_tasks_sampling_carries_its_service_tier(asked: str | None, tier: int) -> None:
    stored = {"model": MODEL, "input": "hi", "service_tier": asked}
    assert sampling_of(from_stored(stored)).tier == tier


@pytest.mark.slow
def test_llama_server_ignores_priority_and_a_priority_task_runs_by_the_claim(
    lmsp: Server, upstream: Upstream
) -> None:
    ids = prompt_tokens("Name a colour.")
    plain = {"prompt": ids, "n_predict": 8, "temperature": 0}
    answers = [
        httpx.post(f"{upstream.url}/completion", json={**plain, **extra}, timeout=60)
        for extra in ({}, {"priority": -1}, {"priority": "not a number"})
    ]
    assert [a.status_code for a in answers] == [200, 200, 200]  # accepted and ignored
    assert len({a.json()["content"] for a in answers}) == 1
    with lmsp.client(timeout=300) as http:
        caps = add(http, upstream)["remote"]["capabilities"]
        body = {"model": MODEL, "input": "Name a colour.", "temperature": 0}
        done = http.post(
            "/v1/responses", json={**body, "max_output_tokens": 16, "service_tier": "priority"}
        )
    assert caps["priority"] is False
    assert done.status_code == 200, done.text
    assert done.json()["service_tier"] == "priority"
    assert output_text(done.json()) == decoded(upstream.greedy(ids, 16))


def test_the_tiers_are_the_claim_orders() -> None:
    from lmsp.engines.base import DEFAULT_TIER
    from lmsp.store.tasks import DEFAULT_TIER as CLAIMED
    from lmsp.store.tasks import TIERS

    assert DEFAULT_TIER == CLAIMED and TIERS["priority"] > DEFAULT_TIER > TIERS["flex"]
