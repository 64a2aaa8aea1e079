"""What the commands that talk to a running server share: where it is and which token."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from lmsp.client import default_target


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None


def target(url: str | None, token: str | None, data_dir: Path | None = None) -> Target:
    """``--url``/``LMSP_URL`` (default: this machine's service) and ``--token``/
    ``LMSP_TOKEN`` (default: the owner token in the data directory)."""
    try:
        base, secret = default_target(url, token, data_dir)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    return Target(base.rstrip("/"), secret)
