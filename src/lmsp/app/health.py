"""The service's health and identity: whether its storage takes writes, each model's
engine process, and the service's id, protocol and version."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmsp import PROTOCOL, __version__
from lmsp.app.core import Core


@dataclass(frozen=True)
class Health:
    """``writable``: the storage takes writes (else reads work and new work is refused
    with ``507`` while the runner retries its tasks' last writes); ``shown``: the
    health object (``status``, ``engines``, ``failed_models``, the storage's report)."""

    writable: bool
    shown: dict[str, Any]


def health(core: Core) -> Health:
    """``status`` ``ok``, or ``degraded`` while the storage refuses writes (a full disk)
    or a model's engine kept crashing past ``LMSP_ENGINE_RESTARTS`` (that model cannot
    run: ``failed_models`` names it and its ``error``)."""
    report = core.db.health.report()
    engines = core.host.engine_status()
    failed = [{"model": e["model"], "error": e["error"]} for e in engines if e["state"] == "failed"]
    models = {"failed_models": failed} if failed else {}
    if report.status == "ok":
        status = "degraded" if failed else "ok"
        return Health(True, {"status": status, **models, "engines": engines})
    return Health(False, {**report.as_dict(), **models, "engines": engines})


def identity(core: Core) -> dict[str, Any]:
    """The ``service`` object."""
    return {
        "object": "service",
        "id": core.service_id,
        "name": "lmsp",
        "protocol": PROTOCOL,
        "version": __version__,
        "started_at": core.started_at,
    }
