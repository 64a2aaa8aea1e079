"""``lmsp run [MODEL] PROMPT``: ask the running service and print the text as it is
generated (``ollama run MODEL PROMPT`` works the same)."""

from __future__ import annotations

from typing import Any

import click

from lmsp.cli.errors import CliError
from lmsp.cli.remote import connect, finish, handled, note, print_json, print_stream, remote_options
from lmsp.client import APIError
from lmsp.protocol.events import TERMINAL as TERMINAL_EVENTS


def _model_and_prompt(words: tuple[str, ...], model: str | None) -> tuple[str | None, str]:
    """``PROMPT`` alone, or ``MODEL PROMPT…`` (the rest joined), or every word the
    prompt when ``-m`` names the model."""
    if model is not None or len(words) == 1:
        return model, " ".join(words)
    return words[0], " ".join(words[1:])


@click.command("run", short_help="Run a prompt on a model and stream the answer.")
@click.argument("words", nargs=-1, required=True, metavar="[MODEL] PROMPT")
@click.option("--model", "-m", help="Model id (default: the service's default model).")
@click.option("--background", is_flag=True, help="Queue it and print its ids; do not wait.")
@click.option(
    "--on-restart",
    type=click.Choice(["fail", "retry", "resume"]),
    help="What a server restart does to it (default: the service's setting).",
)
@click.option("--instructions", help="System instructions.")
@click.option("--max-output-tokens", type=click.IntRange(min=1), help="Stop after this many.")
@click.option("--temperature", type=click.FloatRange(0, 2), help="Sampling temperature (0 … 2).")
@click.option("--seed", type=click.IntRange(min=0), help="Sampling seed.")
@remote_options
def run(
    words: tuple[str, ...],
    model: str | None,
    background: bool,
    on_restart: str | None,
    instructions: str | None,
    max_output_tokens: int | None,
    temperature: float | None,
    seed: int | None,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Run PROMPT on MODEL (default: the service's default model) and stream the answer.

    `lmsp run "Say hi."` on the default model, `lmsp run MODEL "Say hi."` (or
    -m MODEL) on another; the words after MODEL make one prompt, as with `ollama run`.

    The work is a durable background task: if the connection drops or the server
    restarts, the stream picks up from the last event seen. Ctrl-C cancels it.
    """
    model, prompt = _model_and_prompt(words, model)
    options: dict[str, Any] = {
        "on_restart": on_restart,
        "instructions": instructions,
        "max_output_tokens": max_output_tokens,
        "temperature": temperature,
        "seed": seed,
    }
    fields = {k: v for k, v in options.items() if v is not None}
    with connect(url, token) as api:
        if model is None:
            try:
                models = api.models()
            except APIError as exc:
                if exc.status != 403:
                    raise
                raise CliError(
                    "finding the default model needs the scope 'models:read', which this"
                    " token lacks: name the model with -m MODEL",
                    exc.code,
                ) from None
            if not models:
                raise CliError("the service has no model; add one first", "no_model")
            model = str(models[0]["id"])
        created = api.create(model=model, input=prompt, background=True, **fields)
        if background:
            if as_json:
                print_json(created)
            else:
                click.echo(f"{created['id']}  task {created['task']['id']}  {created['status']}")
                note(f"follow it with: lmsp tasks follow {created['task']['id']}")
            return
        try:
            if as_json:
                terminal: dict[str, Any] | None = None
                for event in api.stream(created["id"]):
                    if event.get("type") in TERMINAL_EVENTS:
                        terminal = event
                print_json(api.retrieve(created["id"]))
            else:
                terminal = print_stream(api.stream(created["id"]), as_json=False)
        except KeyboardInterrupt:
            with handled():
                api.cancel(created["id"])
            raise CliError("interrupted: the response was cancelled", "cancelled") from None
    finish(terminal)
