"""Real agent clients against a real ``lmsp serve`` and the bundled model (issue 24):
Codex CLI and Claude Code with their default configuration, the OpenAI Agents SDK,
PydanticAI and simonw's ``llm``; an unknown model's one ``404``, an alias, and every
refusal's log line naming its code. Slow: each agent turn reads a long prompt with the
135M model on a shared machine, so each runs the fewest turns that show it works."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import npm_agents
from tests.helpers import Server, served
from tests.test_readme import blocks

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
#: Claude Code's and Codex's prompts are long (tools and instructions): a context
#: beyond the model's trained 8192 holds them, its positions stretched by YaRN
CONTEXT = "32768"
ERROR_LINE = re.compile(r'"[A-Z]+ (?P<path>\S+) HTTP/[\d.]+" (?P<status>[45]\d\d)')


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("agents") / "data"
    # one agent at a time: one sequence (and the reserved one) of 32k tokens each
    with served(data, env={"LMSP_N_CTX": CONTEXT, "LMSP_PARALLEL": "1"}) as srv:
        yield srv


def refusals_in_log(srv: Server, since: int) -> list[str]:
    """The ``4xx``/``5xx`` access lines written after byte ``since`` of the log."""
    text = srv.log_path.read_bytes()[since:].decode(errors="replace")
    return [line for line in text.splitlines() if ERROR_LINE.search(line)]


def log_size(srv: Server) -> int:
    return srv.log_path.stat().st_size


def alias(srv: Server, name: str) -> None:
    with srv.client() as api:
        made = api.put(f"/v1/model_aliases/{name}", json={"model": MODEL})
        assert made.status_code == 200, made.text


# -- Codex CLI and Claude Code, from npm -----------------------------------------------------
@pytest.fixture(scope="session")
def npm_bin() -> Path:
    return npm_agents.install()


def test_codex_exec_with_its_default_config(server: Server, npm_bin: Path, tmp_path: Path) -> None:
    """A ``config.toml`` naming only the provider: Codex asks for its own default model
    (an alias here), sends its default tools (in ``additional_tools`` items for that
    model: a namespace holding a custom tool), ``reasoning``, ``text.verbosity``,
    ``store: false``, ``include``, ``prompt_cache_key``, ``client_metadata``."""
    alias(server, npm_agents.CODEX_DEFAULT_MODEL)
    home = tmp_path / "codex-home"
    home.mkdir()
    # the config docs/clients.md gives, at this server's address
    (config,) = blocks((Path(__file__).parent.parent / "docs" / "clients.md").read_text(), "toml")
    config = config.replace("http://127.0.0.1:8430", server.url)
    assert 'env_key = "AGENT_TOKEN"' in config and "stream_idle_timeout_ms" in config
    (home / "config.toml").write_text(config)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "CODEX_HOME": str(home),
        "AGENT_TOKEN": server.token,
    }
    since = log_size(server)
    done = subprocess.run(
        [str(npm_bin / "codex"), "exec", "--skip-git-repo-check", "say hello"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert refusals_in_log(server, since) == []


# ~8 min for its ~21k-token prompt; and the 135M model, though it answers in words at that
# length with YaRN, seldom stops: 1 of 2 full runs exited 0, and 3 of 3 sampled answers to
# its prompt ran to 1,024 tokens (docs/clients.md)
@pytest.mark.long
def test_claude_code_print_with_its_default_tools(
    server: Server, npm_bin: Path, tmp_path: Path
) -> None:
    """Only ``ANTHROPIC_BASE_URL``, a token and the model; Claude Code's default tools
    (``TaskCreate``'s ``propertyNames``: relaxed, checked after generation); no call
    outside (the ``DISABLE_*`` variables)."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "ANTHROPIC_BASE_URL": server.url,
        "ANTHROPIC_AUTH_TOKEN": server.token,
        "ANTHROPIC_MODEL": MODEL,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "API_TIMEOUT_MS": "3600000",
        # its first turn reads ~21k prompt tokens: on a busy 2-core machine, longer than
        # its 5-minute wait for the next event
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": "3600000",
        # it asks for up to 32,000 tokens: a bound on the 135M model's rambling
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "64",
    }
    since = log_size(server)
    done = subprocess.run(
        [str(npm_bin / "claude"), "-p", "Name three colours."],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "API Error" not in output, output[-3000:]
    assert refusals_in_log(server, since) == []


# -- the Python agent frameworks --------------------------------------------------------------
def test_openai_agents_sdk_runs_a_tool_turn_and_streams(server: Server) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny in {city}."

    async def run() -> tuple[Any, list[str]]:
        sdk = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=server.token)
        model = OpenAIResponsesModel(model=MODEL, openai_client=sdk)
        agent = Agent(
            name="weather",
            instructions="Answer with the tool.",
            model=model,
            tools=[get_weather],
            # one call (~28 tokens): the small model otherwise often adds a second call
            # to another city, and now and then a third, past the 64-token budget
            model_settings=ModelSettings(
                tool_choice="required", parallel_tool_calls=False, max_tokens=64
            ),
            tool_use_behavior="stop_on_first_tool",
        )
        result = await Runner.run(agent, "Weather in Paris?", max_turns=2)
        # the Agents SDK takes an `incomplete` answer for an error: stopped at its first
        # sentence's end (lmsp's `stop`), well within its budget
        settings = ModelSettings(temperature=0, max_tokens=200, extra_body={"stop": ["."]})
        plain = Agent(name="plain", model=model, model_settings=settings)
        streamed = Runner.run_streamed(plain, "Say hi.", max_turns=1)
        kinds = [event.type async for event in streamed.stream_events()]
        await sdk.close()
        return result, [*kinds, str(streamed.final_output)]

    result, streamed = asyncio.run(run())
    assert calls and result.final_output == f"Sunny in {calls[0]}."
    assert "raw_response_event" in streamed


def test_pydantic_ai_agent_with_a_tool_and_a_structured_output(server: Server) -> None:
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    class City(BaseModel):
        name: str
        country: str

    model = OpenAIChatModel(
        MODEL, provider=OpenAIProvider(base_url=f"{server.url}/v1", api_key=server.token)
    )
    agent: Agent[None, City] = Agent(model, output_type=City, retries=2)
    looked_up: list[str] = []

    @agent.tool_plain
    def lookup(name: str) -> str:
        """Where a city is."""
        looked_up.append(name)
        return f"{name} is in France."

    result = agent.run_sync(
        "Which country is Paris in?",
        # greedy, so a run is the same each time (the 135M model sampled may call the
        # tool again and again)
        model_settings={"max_tokens": 96, "temperature": 0},
        usage_limits=UsageLimits(request_limit=4),
    )
    assert isinstance(result.output, City)


def test_llm_chat_streaming_and_schema(server: Server, tmp_path: Path) -> None:
    """simwn's ``llm`` through its OpenAI-compatible model config."""
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: lmsp\n  model_name: {MODEL}\n  api_base: {server.url}/v1\n"
        "  api_key_name: lmsp\n  supports_schema: true\n"
    )
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "LLM_LMSP_KEY": server.token}
    (tmp_path / "keys.json").write_text(json.dumps({"lmsp": server.token}))
    llm = [str(Path(sys.executable).parent / "llm"), "-m", "lmsp"]

    def run(*args: str) -> str:
        done = subprocess.run([*llm, *args], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    assert run("-o", "max_tokens", "16", "Say hi.").strip()  # streams by default
    assert run("-o", "max_tokens", "16", "--no-stream", "Say hi.").strip()
    shaped = json.loads(run("-o", "max_tokens", "200", "--schema", "name, age int", "A person."))
    assert {"name", "age"} <= set(shaped) and isinstance(shaped["age"], int)  # more are allowed
    chat = subprocess.run(
        [str(Path(sys.executable).parent / "llm"), "chat", "-m", "lmsp"],
        input="Say hi.\nquit\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert chat.returncode == 0 and "Chatting with lmsp" in chat.stdout, chat.stderr[-2000:]


# -- an unknown model, an alias, and the log ---------------------------------------------------
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/responses", {"input": "hi", "max_output_tokens": 4}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 4}),
    ("/v1/embeddings", {"input": "hi"}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
]


def test_unknown_model_alias_and_every_refusal_logs_its_code(server: Server) -> None:
    since = log_size(server)
    with server.client(timeout=600) as api:
        for path, body in ROUTES:
            answer = api.post(path, json={**body, "model": "text-embedding-3-small"})
            assert answer.status_code == 404, (path, answer.text)
            assert MODEL in answer.text and "text-embedding-3-small" in answer.text, path
        api.post("/v1/responses", json={"model": MODEL, "input": "hi", "top_p": 7})
        api.post("/v1/responses", json={"model": MODEL, "input": "hi", "prompt": {"id": "pmpt_1"}})
        assert api.get("/v1/no-such-route").status_code == 404
        assert httpx.post(f"{server.url}/v1/responses", json={}).status_code == 401
        alias(server, "text-embedding-3-small")
        for path, body in ROUTES:
            answer = api.post(path, json={**body, "model": "text-embedding-3-small"})
            assert answer.status_code == 200, (path, answer.text)
        recent = api.get("/v1/refusals", params={"limit": 9}).json()["data"]
    lines = refusals_in_log(server, since)
    assert len(lines) == 9
    for line in lines:
        assert "code=" in line, line
    assert any("code=model_not_found param=model" in line for line in lines)
    assert any("code=invalid_value param=top_p" in line for line in lines)
    assert [r["code"] for r in recent][:3] == [
        "invalid_token",
        "not_found",
        "unsupported_parameter",
    ]
