"""What the commands that talk to a running server share: where it is and which token."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import click

from lmsp import config
from lmsp.client import default_target

from .safe import clean


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None
    # where the token came from: "--token", "LMSP_TOKEN", the owner token file, or None
    token_source: str | None = None


#: the hint every "cannot reach" error ends with
START_HINT = "is it running? start it with `lmsp serve`"


def _global(name: str) -> str | None:
    """``lmsp --url … COMMAND``: the option given before the command."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    found = obj.get(name) if isinstance(obj, dict) else None
    return str(found) if found else None


def target(url: str | None, token: str | None, data_dir: Path | None = None) -> Target:
    """``--url``/``LMSP_URL`` (default: this machine's service) and ``--token``/
    ``LMSP_TOKEN`` (default: the owner token in the data directory); either option may
    be given before the command too."""
    url = url or _global("url")
    token = token or _global("token")
    try:
        base, secret = default_target(url, token, data_dir)
        settings = config.from_env()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
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
    return Target(base.rstrip("/"), secret, source)


def api_error_line(status: int, code: str, message: str, where: Target | None) -> str:
    """The one error format of every command: ``<message> (<code>)``, and for a refused
    token what to do about it."""
    line = f"{clean(message)} ({clean(code)})"
    if status != 401 or where is None:
        return line
    if where.token_source is None:
        return f"{line} No token: pass --token or set LMSP_TOKEN."
    tail = f"({clean(code)})"
    if where.token_source in ("--token", "LMSP_TOKEN"):
        return f"The token from {where.token_source} was refused: unknown or revoked {tail}"
    return f"The owner token in {where.token_source} was refused: another data directory? {tail}"
