"""The OpenAI Agents SDK keeping its memory in lmsp: ``Runner.run(…, conversation_id=…)``
(the conversation kept server-side, each turn appended when it finishes) and an
``OpenAIConversationsSession`` (the SDK adds the items itself), against a real
``lmsp serve`` running the real model — the worked example of docs/conversations.md."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from agents import (
    Agent,
    OpenAIConversationsSession,
    OpenAIResponsesModel,
    Runner,
    set_tracing_disabled,
)
from agents.model_settings import ModelSettings
from openai import AsyncOpenAI

from tests.helpers import Server

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data").start()
    try:
        yield srv
    finally:
        srv.stop()


async def scenario(server: Server) -> None:
    set_tracing_disabled(True)  # no traces leave the machine
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=server.token, max_retries=0)
    agent = Agent(
        name="Assistant",
        instructions="Answer in one short sentence.",
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        # the Agents SDK takes an `incomplete` answer for a failure: a small model is
        # stopped at its first sentence's end (lmsp's `stop`), well within its budget
        model_settings=ModelSettings(temperature=0, max_tokens=200, extra_body={"stop": ["."]}),
    )
    # 1. the conversation lives in lmsp: the runner sends `conversation`
    conv = await client.conversations.create()
    await Runner.run(agent, "My name is Ada.", conversation_id=conv.id)
    await Runner.run(agent, "What is my name?", conversation_id=conv.id)
    items = [item async for item in client.conversations.items.list(conv.id, order="asc")]
    roles = [getattr(item, "role", None) for item in items]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert items[0].content[0].text == "My name is Ada."  # type: ignore[union-attr]
    # 2. a session: the SDK reads the items before a turn and adds the new ones after
    session = OpenAIConversationsSession(openai_client=client)
    await Runner.run(agent, "The code word is PLUM.", session=session)
    await Runner.run(agent, "What is the code word?", session=session)
    stored = await session.get_items()
    assert len(stored) == 4
    texts = [item.get("content") for item in stored if item.get("role") == "user"]
    assert texts[0] == "The code word is PLUM." or texts[0][0]["text"] == "The code word is PLUM."
    listed = [item async for item in client.conversations.items.list(session.session_id)]
    assert len(listed) == 4
    await client.close()


def test_agents_sdk_keeps_its_memory_in_lmsp(server: Server) -> None:
    asyncio.run(scenario(server))
