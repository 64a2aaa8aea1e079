"""The one error voice of the ``lmsp`` command.

Every error is one line on stderr, ``Error: <message> (<code>)``, and a non-zero exit
(2 for a command line click could not parse, 1 otherwise). ``<code>`` is the service's
error code when the service refused (``not_found``, ``invalid_token``) and one of the
command's own otherwise (``unreachable``, ``cancelled``, ``usage``), so a script can
match on it and a person reads the why first. Any hint belongs to the message, before
the code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from lmsp.cli.safe import clean


class CliError(click.ClickException):
    """An error of the ``lmsp`` command: a message and a code, shown as one line."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code

    def format_message(self) -> str:
        return f"{clean(self.message)} ({clean(self.code)})"


class UsageLine(CliError):
    """A command line click could not parse, said in the one format (exit status 2)."""

    exit_code = 2

    def __init__(self, exc: click.UsageError) -> None:
        where = exc.ctx.command_path if exc.ctx is not None else "lmsp"
        text = exc.format_message().rstrip(".")
        super().__init__(f"{text}; see `{where} -h`", "usage")


@contextmanager
def one_line_usage() -> Iterator[None]:
    """Turn click's usage errors (usage, a hint and the error on three lines) into
    :class:`UsageLine`; help a group shows for want of a command stays help."""
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise
    except click.UsageError as exc:
        raise UsageLine(exc) from None


class Root(click.Group):
    """The ``lmsp`` group: parse errors of any command come out as one line."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with one_line_usage():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with one_line_usage():
            return super().invoke(ctx)


class Lazy(Root):
    """The ``lmsp`` group whose commands other than those declared with it come from
    :attr:`more`, called once, when a command it does not hold yet is named or the
    commands are listed (``lmsp serve`` imports none of the others)."""

    more: Callable[[], None] | None = None

    def _complete(self) -> None:
        more, self.more = self.more, None
        if more is not None:
            more()

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            self._complete()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._complete()
        return super().list_commands(ctx)
