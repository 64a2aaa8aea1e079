"""What the commands that talk to a running server share: connection options, one-line
errors, ``--json`` output, rich tables and printing a response's text as it streams."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from lmsp.cli.common import JSON_HELP, TOKEN_HELP, URL_HELP, Target, api_error, target, unreachable
from lmsp.cli.errors import CliError
from lmsp.cli.safe import clean, clean_json
from lmsp.client import APIError, Client, ClientError, UnreachableError

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def remote_options(func: F) -> F:
    """``--url``, ``--token`` and ``--json`` for a command that talks to the server."""
    func = click.option("--json", "as_json", is_flag=True, help=JSON_HELP)(func)
    func = click.option("--token", help=TOKEN_HELP)(func)
    func = click.option("--url", help=URL_HELP)(func)
    return func


def limit_option(most: int, default: int, name: str = "limit") -> Callable[[F], F]:
    """``--limit``: how many rows a listing asks for (1 to ``most``, the server's bound);
    ``name``: the command's parameter."""
    return click.option(
        "--limit",
        name,
        type=click.IntRange(1, most),
        default=default,
        show_default=True,
        help="How many to list.",
    )


def _error(exc: ClientError, where: Target | None) -> CliError:
    if isinstance(exc, APIError):
        return api_error(exc.status, exc.code, exc.message, where)
    if isinstance(exc, UnreachableError):
        return unreachable(exc.url, where)
    return CliError(str(exc), "client_error")


@contextlib.contextmanager
def handled(where: Target | None = None) -> Iterator[None]:
    """Turn client errors into one clear line and a non-zero exit, never a traceback."""
    try:
        yield
    except ClientError as exc:
        raise _error(exc, where) from None
    except ValueError as exc:
        raise CliError(str(exc), "invalid_value") from None


@contextlib.contextmanager
def connect(url: str | None, token: str | None) -> Iterator[Client]:
    where = target(url, token)
    with handled(where), Client(where.url, where.token) as api:
        yield api


def ask(url: str | None, token: str | None, as_json: bool, call: Callable[[Client], T]) -> T | None:
    """What ``call`` gets from the service; with ``--json`` it is printed as it came and
    the answer is None: the command has nothing to add."""
    with connect(url, token) as api:
        answer = call(api)
    if as_json:
        print_json(answer)
        return None
    return answer


def console() -> Console:
    """A console on the current stdout (wide when it is not a terminal, so ids never wrap)."""
    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200)


def print_json(obj: Any) -> None:
    click.echo(clean_json(obj))


def table(title: str | None, columns: Iterable[str], rows: Iterable[Iterable[Any]]) -> None:
    out = Table(title=title, title_justify="left", header_style="bold")
    for name in columns:
        out.add_column(name, no_wrap=name in {"ID", "TASK", "RESPONSE", "CODE", "TOKEN PREFIX"})
    for row in rows:
        out.add_row(*(v if isinstance(v, Text) else escape(clean(v)) for v in row))
    console().print(out)


def size(n: int | None) -> str:
    """Bytes as ``92.0 MiB``."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def when(stamp: int | None) -> str:
    if stamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def scopes_option(required: bool, help_text: str) -> Callable[[F], F]:
    return click.option(
        "--scopes",
        multiple=True,
        required=required,
        help=help_text + " Comma-separated or repeated.",
    )


def split_scopes(values: tuple[str, ...]) -> list[str]:
    return [s for v in values for s in v.replace(",", " ").split() if s]


def note(text: str) -> None:
    click.echo(f"[lmsp] {clean(text)}", err=True)


def print_stream(events: Iterable[dict[str, Any]], as_json: bool) -> dict[str, Any] | None:
    """Write the text deltas as they come (or every event as a JSON line); return the
    terminal event. Restarts the server went through are noted on stderr."""
    terminal: dict[str, Any] | None = None
    wrote = False
    for event in events:
        kind = event.get("type", "")
        if as_json:
            click.echo(clean_json(event, indent=None))
        elif kind == "response.output_text.delta":
            click.echo(clean(event.get("delta", ""), multiline=True), nl=False)
            wrote = True
        elif kind == "response.queued" and event.get("reset"):
            if wrote:
                click.echo()
            note("the server restarted: the task starts again from the beginning")
            wrote = False
        elif kind == "response.in_progress" and event.get("resumed"):
            note("the server restarted: the task resumes where it stopped")
        if kind in {
            "response.completed",
            "response.incomplete",
            "response.failed",
            "response.cancelled",
        }:
            terminal = event
    if wrote:
        click.echo()
    return terminal


def finish(terminal: dict[str, Any] | None) -> None:
    """Exit non-zero for a failed or cancelled response, with one line saying why."""
    if terminal is None:
        raise CliError("the stream ended before the response finished", "stream_ended")
    kind = terminal["type"]
    if kind == "response.failed":
        error = (terminal.get("response") or {}).get("error") or {}
        code = str(error.get("code") or "failed")
        raise CliError(f"the response failed: {error.get('message', '')}", code)
    if kind == "response.cancelled":
        raise CliError("the response was cancelled", "cancelled")
    if kind == "response.incomplete":
        note("stopped at max_output_tokens")
