"""What the commands that talk to a running server share: where it is and which token."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import click

from lmsp import config


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None


def target(url: str | None, token: str | None, data_dir: Path | None = None) -> Target:
    """``--url``/``LMSP_URL`` (default: this machine's service) and ``--token``/
    ``LMSP_TOKEN`` (default: the owner token in the data directory)."""
    try:
        settings = config.from_env()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    if data_dir is not None:
        settings = settings.with_overrides(data_dir=data_dir)
    base = url or os.environ.get("LMSP_URL") or f"http://{settings.host}:{settings.port}"
    secret = token or os.environ.get("LMSP_TOKEN")
    if secret is None and settings.owner_token_path.exists():
        secret = settings.owner_token_path.read_text().strip()
    return Target(base.rstrip("/"), secret)
