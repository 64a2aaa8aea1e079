"""Pulling a model by name from the hub, as a durable task (PROTOCOL.md section 12).

The reference is checked against the hub before anything is written (a missing
repository or quantization is a ``400`` now, not a failed task later), the disk must
have room for the files not in the blob store yet (``507``), and then the pull's task is
committed and handed to the downloader (:mod:`lmsp.outbound.pull`). Pulling the same
reference again while its pull is unfinished answers that pull's task: the same pull
goes on, never a second one.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass
from typing import Any

from lmsp import errors
from lmsp.app.core import Core
from lmsp.datadir import ensure_private_dir
from lmsp.outbound.hub import Hub, Reference, parse_reference
from lmsp.outbound.pull import Downloader
from lmsp.protocol import objects
from lmsp.protocol.records import TaskRecord
from lmsp.store import audit, blobs, idempotency, models, pulls
from lmsp.store import tasks as task_store
from lmsp.store.clients import Client
from lmsp.store.sql import Conn


@dataclass(frozen=True)
class Target:
    """What to pull (``hf.co/{owner}/{repo}:{quant}``) and the model id it makes."""

    ref: Reference
    model_id: str


@dataclass(frozen=True)
class Pulled:
    """The pull's task object (as rendered), and whether this answer replays an
    idempotency key."""

    task_object: dict[str, Any]
    model_id: str
    replayed: bool = False


def target(source: str, model_id: str | None) -> Target:
    """The reference ``source`` names and the model's id (``model_id``, else the
    reference's own), or ``400``."""
    ref = parse_reference(source)
    wanted = model_id or ref.default_id
    if len(wanted) > 128:
        raise errors.invalid("The default id is too long: name one with `id`.", "id")
    return Target(ref, wanted)


async def pull(core: Core, client: Client, wanted: Target, key: idempotency.Key | None) -> Pulled:
    """Start pulling ``wanted`` (or join its unfinished pull): its task."""
    downloader = core.runner.pulls
    assert downloader is not None
    running = await core.read(_joined, core, client, wanted)
    if running is not None:  # the same pull goes on
        return Pulled(running, wanted.model_id)
    await core.read(_refuse_taken, core, wanted.model_id)
    revision, files = await _resolved(core, downloader, wanted.ref)

    def job(conn: Conn) -> tuple[Any, bool]:
        made = pulls.create(
            conn,
            client_id=client.id,
            ref=wanted.ref.canonical,
            model_id=wanted.model_id,
            node=core.node,
            repo=wanted.ref.repo,
            revision=revision,
            quant=wanted.ref.quant,
            files=files,
            max_queue=core.settings.max_queue,
            key=key,
        )
        if not made[1] and not made[0].replayed:  # a new pull, not the same one again
            change = {"from": wanted.ref.canonical}
            audit.record(conn, client.id, "model.pulled", wanted.model_id, change)
        return made

    created, again = await core.db.write(job)
    core.runner.notify()
    downloader.notify()
    task = await core.read(lambda: task_store.get(core.db.reader(), created.task_id))
    assert task is not None
    return Pulled(await core.read(_shown, core, task), wanted.model_id, again and key is not None)


def _shown(core: Core, task: TaskRecord) -> dict[str, Any]:
    return objects.render_task(task, task_store.queue_position(core.db.reader(), task))


def _joined(core: Core, client: Client, wanted: Target) -> dict[str, Any] | None:
    """The task of the unfinished pull of the same reference into the same id."""
    task = pulls.unfinished(core.db.reader(), wanted.ref.canonical, wanted.model_id, core.node)
    if task is None:
        return None
    if not client.oversees(task.client_id):
        raise errors.LmspError(
            "conflict", f"Another client is pulling {wanted.model_id!r}.", param="id"
        )
    return _shown(core, task)


def _refuse_taken(core: Core, model_id: str) -> None:
    """``409`` when a model has that id, or another pull into it is unfinished."""
    conn = core.db.reader()
    if models.get(conn, model_id) is not None:
        raise errors.LmspError("model_exists", f"A model {model_id!r} exists.", param="id")
    if pulls.any_unfinished_into(conn, model_id, core.node):
        raise errors.LmspError(
            "conflict", f"Another pull into {model_id!r} is unfinished.", param="id"
        )


async def _resolved(
    core: Core, downloader: Downloader, ref: Reference
) -> tuple[str, list[pulls.HubFile]]:
    """The reference's revision and files at the hub, once the disk has room for those
    not in the blob store yet (else ``507``)."""
    settings = core.settings

    def resolve() -> tuple[str, list[pulls.HubFile]]:
        with Hub(downloader.endpoint, settings.hf_token) as hub:
            return hub.resolve(ref)

    revision, files = await asyncio.to_thread(resolve)
    needed = sum(
        f.size for f in files if not blobs.blob_path(settings.blobs_dir, f.digest).is_file()
    )
    ensure_private_dir(settings.blobs_dir)
    free = shutil.disk_usage(settings.blobs_dir).free
    if free < needed:
        raise errors.LmspError(
            "insufficient_storage",
            f"The model needs {needed} bytes; the data directory's disk has {free} free.",
        )
    return revision, files
