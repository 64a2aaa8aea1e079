"""Identifiers: ``<prefix>_<random>`` with 128 random bits."""

from __future__ import annotations

import secrets
import time


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def now() -> int:
    return int(time.time())
