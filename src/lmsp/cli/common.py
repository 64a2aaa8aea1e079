"""What the commands that talk to a running server share: where it is and which token."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import click

from lmsp import config, datadir
from lmsp.cli.errors import CliError


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None
    # where the token came from: "--token", "LMSP_TOKEN", the owner token file, or None
    token_source: str | None = None
    # where the owner token was looked for when neither --token nor LMSP_TOKEN was given
    token_file: Path | None = None
    # the data directory, and the process holding it when the command started
    data_dir: Path | None = None
    holder: datadir.Holder | None = None


#: the help of the options many commands share: the same words everywhere
URL_HELP = (
    "Service address (LMSP_URL; default: where the data directory's service listens,"
    " else http://127.0.0.1:8430)."
)
TOKEN_HELP = "Bearer token (LMSP_TOKEN; default: the data directory's owner token)."
JSON_HELP = "Print JSON, for scripts."
DATA_DIR_HELP = config.declared("data_dir").option_help("Data directory")

#: the hint a "cannot reach" error gives when no process holds the data directory
START_HINT = "is it running? start it with `lmsp serve`"


def unreachable(url: str, where: Target | None = None) -> CliError:
    """No answer at ``url``; the hint says what the data directory says of its service
    (never to start one on a directory a process holds: that start would be refused)."""
    held = where.holder if where is not None else None
    if held is None or where is None:
        hint = START_HINT
    elif held.url is None:
        hint = f"{where.data_dir} is held by {held} (not a server: wait for it to end)"
    elif held.url.rstrip("/") == url.rstrip("/"):
        hint = f"{held.command or 'lmsp'} (pid {held.pid}) holds {where.data_dir} and"
        hint += " does not answer there yet: still starting?"
    else:
        hint = f"the service of {where.data_dir} (pid {held.pid}) serves on {held.url}"
    return CliError(f"cannot reach lmsp at {url}: {hint}", "unreachable")


def _global(name: str) -> str | None:
    """``lmsp --url … COMMAND``: the option given before the command."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    found = obj.get(name) if isinstance(obj, dict) else None
    return str(found) if found else None


def target(url: str | None, token: str | None, data_dir: Path | None = None) -> Target:
    """``--url``/``LMSP_URL`` (default: where the service holding the data directory
    serves) and ``--token``/``LMSP_TOKEN`` (default: the owner token in the data
    directory); either option may be given before the command too."""
    url = url or _global("url")
    token = token or _global("token")
    try:
        from lmsp.client import default_target  # here: `lmsp serve` needs no client

        base, secret = default_target(url, token, data_dir)
        settings = config.from_env()
    except ValueError as exc:
        raise CliError(str(exc), "invalid_setting") from exc
    if data_dir is not None:
        settings = settings.with_overrides(data_dir=data_dir)
    if token:
        source: str | None = "--token"
    elif os.environ.get("LMSP_TOKEN"):
        source = "LMSP_TOKEN"
    elif secret is not None:
        source = str(settings.owner_token_path)
    else:
        source = None
    return Target(
        base.rstrip("/"),
        secret,
        source,
        settings.owner_token_path,
        settings.data_dir,
        datadir.holder(settings.data_dir),
    )


def api_error(status: int, code: str, message: str, where: Target | None) -> CliError:
    """A refusal of the service as the one error line, ``<message> (<code>)``; for a
    refused token the message says which token it was and what to do about it."""
    if status != 401 or where is None:
        return CliError(message, code)
    if where.token_source is None:
        looked = f"no owner token in {where.token_file}" if where.token_file else "no token"
        return CliError(
            f"No token: {looked} (is LMSP_DATA_DIR the service's data directory?);"
            " pass --token or set LMSP_TOKEN",
            code,
        )
    if where.token_source in ("--token", "LMSP_TOKEN"):
        refused = f"The token from {where.token_source} was refused: unknown or revoked"
        return CliError(refused, code)
    return CliError(
        f"The owner token in {where.token_source} was refused: another data directory?", code
    )
