"""``docs/clients.md`` as a newcomer reads it: its recipes run as written, in order, in
one shell, against the real server and the bundled model (issue 36, item 14: the
agent's token exported as ``LMSP_TOKEN`` made the next ``lmsp models alias`` fail
``insufficient_scope``).

The machinery is the README tour's (``tests/test_readme.py``): the newcomer's second
terminal in a checkout whose ``.venv`` is this test's environment, a fresh ``HOME`` whose
default data directory holds the bundled model, ``lmsp`` put on ``PATH`` as the tour does
(``. .venv/bin/activate``), and what each command exports kept for the next ones. The
test plays the first terminal: the page's ``lmsp serve`` line, with its settings (and one
sequence: the machine is shared). The files the page has the user write (Codex's
``config.toml``, ``llm``'s model list) are written where it says. Only the port differs.

Two commands need agents this environment does not install: ``codex exec`` and
``claude -p`` run for real in ``tests/test_agents_real.py`` (with Codex's config taken
from this page). Here each is replaced by the request it makes, from this shell with
what the recipe set in it: Codex's ``env_key`` variable and ``base_url`` from the
config written, its default model (the alias the recipe made); Claude Code's
``ANTHROPIC_*`` variables. So a recipe that leaves the shell unable to serve its agent
fails here.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests import npm_agents
from tests.test_readme import Service, User, answered_well, commands, first_hour

pytestmark = pytest.mark.slow

CLIENTS = Path(__file__).resolve().parent.parent / "docs" / "clients.md"
#: what the user types into ``llm chat`` (then leaves it)
CHAT_INPUT = "Say hi.\nquit\n"


def recipes() -> list[tuple[str, str]]:
    """The page's fenced blocks a user acts on, in order: ``sh`` (typed), ``toml`` and
    ``yaml`` (files written)."""
    text = CLIENTS.read_text()
    found = re.findall(r"^```(sh|toml|yaml)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    return [(kind, body) for kind, body in found]


def serve_line(command: str) -> dict[str, str] | None:
    """``LMSP_N_CTX=32768 lmsp serve``: the first terminal's command, its settings."""
    words = shlex.split(command, comments=True)
    if words[-2:] != ["lmsp", "serve"]:
        return None
    return dict(word.split("=", 1) for word in words[:-2])


def codex_request(user: User, config: dict[str, Any], model: str) -> None:
    """What ``codex exec`` sends first, from the shell, as its config says."""
    provider = config["model_providers"][config["model_provider"]]
    assert provider["wire_api"] == "responses"
    body = json.dumps({"model": model, "input": "say hello", "max_output_tokens": 16})
    token = f'"Authorization: Bearer ${provider["env_key"]}"'
    out = user.run(
        f"curl -sf {provider['base_url']}/responses -H {token}"
        f" -H 'content-type: application/json' -d '{body}'"
    )
    assert json.loads(out)["status"] in ("completed", "incomplete"), out


def claude_request(user: User) -> None:
    """What ``claude -p`` sends, from the shell, with the variables the recipe set."""
    body = (
        '{"model": "\'"$ANTHROPIC_MODEL"\'", "max_tokens": 16,'
        ' "messages": [{"role": "user", "content": "Name three colours."}]}'
    )
    out = user.run(
        'curl -sf "$ANTHROPIC_BASE_URL/v1/messages"'
        ' -H "Authorization: Bearer $ANTHROPIC_AUTH_TOKEN"'
        " -H 'anthropic-version: 2023-06-01' -H 'content-type: application/json'"
        f" -d '{body}'"
    )
    assert json.loads(out)["type"] == "message", out


def test_the_clients_recipes_run_in_one_shell(tmp_path: Path, blob_cache: Path) -> None:
    user, data_dir = first_hour(tmp_path, blob_cache)
    home = Path(user.env["HOME"])
    service: Service | None = None
    codex: dict[str, Any] | None = None
    aliased: str | None = None
    ran: list[str] = []
    user.run(". .venv/bin/activate")  # as the README's tour has them do
    try:
        for kind, body in recipes():
            text = user.fill(body)
            if kind == "toml":  # `~/.codex/config.toml`
                assert "`~/.codex/config.toml`" in CLIENTS.read_text()
                (home / ".codex").mkdir(exist_ok=True)
                (home / ".codex" / "config.toml").write_text(text)
                codex = tomllib.loads(text)
                continue
            if kind == "yaml":  # `$(llm logs path | xargs dirname)/extra-openai-models.yaml`
                assert "`$(llm logs path | xargs dirname)/extra-openai-models.yaml`" in (
                    CLIENTS.read_text()
                )
                where = Path(user.run("llm logs path | xargs dirname").strip())
                where.mkdir(parents=True, exist_ok=True)
                (where / "extra-openai-models.yaml").write_text(text)
                continue
            for command in commands(text):
                settings = serve_line(command)
                words = shlex.split(command, comments=True)
                if settings is not None:  # the first terminal
                    assert service is None, "the page starts a second server"
                    service = Service({**user.env, **settings, "LMSP_PARALLEL": "1"}, data_dir)
                    service.start()
                elif words[0] == "codex":
                    assert codex is not None, "codex runs before its config is written"
                    assert aliased == npm_agents.CODEX_DEFAULT_MODEL, aliased
                    codex_request(user, codex, aliased)
                elif words[0] == "claude":
                    claude_request(user)
                else:
                    out = user.run(
                        command, typed=CHAT_INPUT if words[:2] == ["llm", "chat"] else None
                    )
                    answered_well(command, out)
                    if words[:3] == ["lmsp", "models", "alias"]:
                        aliased = words[3]
                ran.append(words[0])
    except AssertionError:
        if service is not None:
            print(service.log_path.read_text()[-4000:])
        raise
    finally:
        print("\n".join(user.transcript))
        if service is not None:
            service.stop()
    # every recipe the page has: the token, Codex, Claude Code, llm, curl
    assert {"export", "lmsp", "codex", "claude", "llm", "curl"} <= set(ran), ran
    assert ran.count("llm") == 4
