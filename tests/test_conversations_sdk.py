"""Conversations, compaction and input token counts through the official ``openai``
SDK, against a real ``lmsp serve`` running the real model (SmolLM2), with ``kill -9``
between and during turns."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.helpers import Server, check_log_invariants, open_db

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
SHORT = 24
HANG_GUARD = 600.0  # seconds; only a hung service ever reaches it


def sdk_for(server: Server, token: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key=token or server.token, max_retries=0, timeout=300
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "data").start()
    try:
        yield srv
    finally:
        srv.stop()


def all_items(sdk: openai.OpenAI, conv: str) -> list[Any]:
    """Every item, oldest first, page by page (``after``/``limit``)."""
    return list(sdk.conversations.items.list(conv, order="asc", limit=3))


def wait_status(sdk: openai.OpenAI, response_id: str, *statuses: str) -> Any:
    deadline = time.monotonic() + HANG_GUARD
    while True:
        current = sdk.responses.retrieve(response_id)
        if current.status in statuses:
            return current
        assert time.monotonic() < deadline, f"{response_id} still {current.status}"
        time.sleep(0.1)


@pytest.mark.timeout(1800)  # real generations on a shared machine
def test_a_conversation_survives_kill_9_whole_turns_only(server: Server) -> None:
    with sdk_for(server) as sdk:
        conv = sdk.conversations.create(
            metadata={"project": "lmsp"},
            items=[{"type": "message", "role": "user", "content": "My name is Ada."}],
        )
        assert conv.object == "conversation" and conv.metadata == {"project": "lmsp"}
        first = sdk.responses.create(
            model=MODEL,
            conversation=conv.id,
            input="The code word is PLUM. Say OK.",
            temperature=0,
            max_output_tokens=SHORT,
        )
        second = sdk.responses.create(
            model=MODEL,
            conversation={"id": conv.id},
            input="What is the code word?",
            temperature=0,
            max_output_tokens=SHORT,
        )
        assert first.status in ("completed", "incomplete")
        assert second.status in ("completed", "incomplete")
        before = all_items(sdk, conv.id)
    server.restart()  # kill -9, then a new process on the same data directory
    with sdk_for(server) as sdk:
        after = all_items(sdk, conv.id)
        # in order, none lost, none doubled: the first item, then (input, output) twice
        assert [i.id for i in after] == [i.id for i in before]
        assert len(after) == 5 and len({i.id for i in after}) == 5
        assert [i.role for i in after] == ["user", "user", "assistant", "user", "assistant"]
        assert after[2].id == first.output[0].id and after[4].id == second.output[0].id
        assert after[1].content[0].text == "The code word is PLUM. Say OK."
        # the next turn's input tokens hold the whole history: the count of its body with
        # the conversation equals the count of the same history sent as input, and the
        # turn's own usage says the same
        history = [i.model_dump(exclude_none=True) for i in after]
        third_input = "Repeat the code word."
        by_conv = sdk.responses.input_tokens.count(
            model=MODEL, conversation=conv.id, input=third_input
        )
        by_input = sdk.responses.input_tokens.count(
            model=MODEL,
            input=[*history, {"type": "message", "role": "user", "content": third_input}],
        )
        alone = sdk.responses.input_tokens.count(model=MODEL, input=third_input)
        assert by_conv.object == "response.input_tokens"
        assert by_conv.input_tokens == by_input.input_tokens > alone.input_tokens
        # a background turn killed while it generates: retried after the restart, its
        # turn is appended once, whole
        third = sdk.responses.create(
            model=MODEL,
            conversation=conv.id,
            input=third_input,
            background=True,
            max_output_tokens=400,
            extra_body={"on_restart": "retry"},
        )
        wait_status(sdk, third.id, "in_progress", "completed", "incomplete")
    server.restart()
    with sdk_for(server) as sdk:
        done = wait_status(sdk, third.id, "completed", "incomplete", "failed")
        assert done.status in ("completed", "incomplete")
        assert done.usage is not None and done.usage.input_tokens == by_conv.input_tokens
        final = all_items(sdk, conv.id)
        assert [i.id for i in final[:5]] == [i.id for i in after]
        assert len(final) == 7 and len({i.id for i in final}) == 7
        assert final[5].content[0].text == third_input
        assert final[6].id == done.output[0].id
        # CRUD of items through the SDK
        added = sdk.conversations.items.create(
            conv.id, items=[{"type": "message", "role": "user", "content": "An aside."}]
        )
        aside = added.data[0].id
        assert sdk.conversations.items.retrieve(aside, conversation_id=conv.id).id == aside
        assert sdk.conversations.items.delete(aside, conversation_id=conv.id).id == conv.id
        with pytest.raises(openai.NotFoundError):
            sdk.conversations.items.retrieve(aside, conversation_id=conv.id)
        updated = sdk.conversations.update(conv.id, metadata={"project": "other"})
        assert updated.metadata == {"project": "other"}
        assert sdk.conversations.retrieve(conv.id).metadata == {"project": "other"}
        # another client: 404 for the conversation, its items and a turn on it
        other = server.client().post(
            "/v1/clients",
            json={"name": "other", "scopes": ["responses:read", "responses:write"]},
        )
        assert other.status_code == 201, other.text
        with sdk_for(server, other.json()["token"]) as stranger:
            with pytest.raises(openai.NotFoundError):
                stranger.conversations.retrieve(conv.id)
            with pytest.raises(openai.NotFoundError):
                stranger.conversations.items.list(conv.id)
            with pytest.raises(openai.NotFoundError):
                stranger.conversations.delete(conv.id)
            with pytest.raises(openai.NotFoundError):
                stranger.responses.create(model=MODEL, conversation=conv.id, input="hi")
        # with previous_response_id: 400
        with pytest.raises(openai.BadRequestError):
            sdk.responses.create(
                model=MODEL, conversation=conv.id, previous_response_id=done.id, input="x"
            )
        assert len(all_items(sdk, conv.id)) == 7
        deleted = sdk.conversations.delete(conv.id)
        assert deleted.deleted and deleted.id == conv.id
        with pytest.raises(openai.NotFoundError):
            sdk.conversations.retrieve(conv.id)
    conn = open_db(server.data_dir)
    check_log_invariants(conn)
    conn.close()


TOPICS = [
    "the weather in Paris in spring",
    "how to bake sourdough bread",
    "the rules of chess openings",
    "planting tomatoes on a balcony",
    "learning to play the guitar",
    "the history of the bicycle",
    "saving money for a holiday",
    "training a puppy to sit",
    "writing a short poem about the sea",
    "repairing a flat bicycle tyre",
    "choosing a good running shoe",
    "making a cup of green tea",
]


def long_history() -> list[dict[str, Any]]:
    """24 messages: twelve questions and twelve answers of a few sentences each."""
    out: list[dict[str, Any]] = []
    for topic in TOPICS:
        out.append(
            {
                "type": "message",
                "role": "user",
                "content": f"Tell me about {topic}. Please give me some practical advice.",
            }
        )
        out.append(
            {
                "type": "message",
                "role": "assistant",
                "content": f"Here is what I know about {topic}. Start small and be patient;"
                " practise a little every day, keep notes of what works, ask people with"
                " experience, and do not worry about mistakes, since they teach you most.",
            }
        )
    return out


@pytest.mark.timeout(1800)  # two summaries and four prompts of ~900 tokens, on a shared machine
def test_compaction_with_the_real_model(server: Server) -> None:
    with sdk_for(server) as sdk:
        history = long_history()
        assert len(history) == 24
        question = {"type": "message", "role": "user", "content": "Which topic came first?"}
        whole = sdk.responses.input_tokens.count(model=MODEL, input=[*history, question])
        compacted = sdk.responses.compact(model=MODEL, input=[*history, question])
        assert compacted.object == "response.compaction"
        kinds = [item.type for item in compacted.output]
        assert kinds == ["compaction", "message"]
        assert compacted.output[0].encrypted_content
        assert compacted.usage.output_tokens > 0
        # sent back as input, the compacted output costs fewer input tokens
        back = [item.model_dump(exclude_none=True) for item in compacted.output]
        smaller = sdk.responses.input_tokens.count(model=MODEL, input=back)
        assert smaller.input_tokens < whole.input_tokens
        answer = sdk.responses.create(
            model=MODEL, input=back, temperature=0, max_output_tokens=SHORT
        )
        assert answer.status in ("completed", "incomplete")
        assert answer.usage is not None and answer.usage.input_tokens == smaller.input_tokens
        # context_management: a create past its threshold compacts first
        managed = sdk.responses.create(
            model=MODEL,
            input=[*history, question],
            temperature=0,
            max_output_tokens=SHORT,
            context_management=[{"type": "compaction", "compact_threshold": 200}],
        )
        assert managed.status in ("completed", "incomplete")
        assert managed.usage is not None and managed.usage.input_tokens < whole.input_tokens
        given = list(sdk.responses.input_items.list(managed.id, order="asc"))
        assert given[0].type == "compaction"
        # under its threshold, nothing is compacted
        kept = sdk.responses.create(
            model=MODEL,
            input=[*history, question],
            temperature=0,
            max_output_tokens=SHORT,
            context_management=[
                {"type": "compaction", "compact_threshold": whole.input_tokens + 1}
            ],
        )
        assert kept.usage is not None and kept.usage.input_tokens == whole.input_tokens
