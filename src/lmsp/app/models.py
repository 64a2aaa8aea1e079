"""Models and their aliases: the model a request names (its id or an alias), and list,
show, import, change, verify and delete models; list, set and delete aliases.

Imports and verifications read whole files, so they run in a worker thread; the
blob-store workflows themselves live in :mod:`lmsp.store.blobs`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from lmsp import errors
from lmsp.app import remote_models
from lmsp.app.core import Core
from lmsp.store import aliases, audit, blobs, models
from lmsp.store.clients import Client
from lmsp.store.models import ModelRecord

Defaults = dict[str, float | int | None]


def model_not_found(model: str, known: list[str] | None = None) -> errors.LmspError:
    """``404 model_not_found``, the same on every route: what to do, and the models
    there are (``known``, when the client may list them)."""
    message = (
        f"The model {model!r} does not exist. Name a model of this server, or make"
        f" {model!r} an alias of one (lmsp models alias {model} MODEL)."
    )
    if known is not None:
        message += f" The models here: {', '.join(known) or 'none'}."
    return errors.LmspError("model_not_found", message, param="model")


async def resolve(core: Core, name: str, client: Client) -> ModelRecord:
    """The model ``name`` names (its id or an alias), or ``404 model_not_found``."""
    record = await core.read(lambda: aliases.resolve(core.db.reader(), name))
    if record is not None:
        return record
    known = None
    if client.allows("models:read"):
        known = await core.read(lambda: [m.id for m in models.all_models(core.db.reader())])
    raise model_not_found(name, known)


def shown(core: Core, record: ModelRecord) -> dict[str, Any]:
    """The model object (a file's header may be read: in a worker thread)."""
    return {
        "id": record.id,
        "object": "model",
        "created": record.created_at,
        "owned_by": record.owned_by,
        "digest": record.digest,
        "size_bytes": record.size_bytes,
        "format": record.format,
        "loaded": core.host.is_loaded(record.id),
        # one sequence's context here (LMSP_N_CTX, LMSP_KV_BUDGET); the trained one is
        # the metadata's context_length
        "context_length": core.host.context_length(record),
        "status": record.status,
        "capabilities": list(models.capabilities(record)),
        "verified_at": record.verified_at,
        "metadata": record.metadata,
        "defaults": record.defaults,
        "remote": record.remote,
    }


async def listing(core: Core) -> list[dict[str, Any]]:
    return await core.read(lambda: [shown(core, r) for r in models.all_models(core.db.reader())])


async def show(core: Core, model_id: str) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        record = models.get(core.db.reader(), model_id)
        if record is None:
            raise errors.not_found("model", model_id)
        return shown(core, record)

    return await core.read(read)


async def import_model(
    core: Core,
    actor: Client,
    model_id: str,
    path: str,
    digest: str | None,
    defaults: Defaults | None,
    remote: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Copy a local file into the blob store as a new model (``digest``: what the
    caller hashed; ``digest_mismatch`` if the file read differs), audited. A ``remote``
    model (:mod:`lmsp.app.remote_models`: another server runs it) keeps ``path`` as its
    tokenizer (or the tokenizer a hub reference in ``path`` names, fetched)."""
    given = None if defaults is None else {k: v for k, v in defaults.items() if v is not None}
    if remote is not None:
        record = await asyncio.to_thread(
            remote_models.add_remote, core, model_id, path, remote, given
        )
    else:
        blobs_dir = core.settings.blobs_dir
        record = await asyncio.to_thread(
            blobs.import_model, core.db, blobs_dir, model_id, Path(path), digest, defaults=given
        )
    change = {
        "digest": record.digest,
        "size_bytes": record.size_bytes,
        "remote": remote is not None,
    }
    await core.db.write(lambda c: audit.record(c, actor.id, "model.added", model_id, change))
    return await core.read(shown, core, record)


async def change_defaults(core: Core, model_id: str, changes: Defaults) -> dict[str, Any]:
    """Change a model's sampling defaults (``None``: remove one); responses created from
    now on use them."""
    record = await core.db.write(lambda c: models.set_defaults(c, model_id, changes))
    if record is None:
        raise errors.not_found("model", model_id)
    return await core.read(shown, core, record)


async def verify(core: Core, model_id: str) -> dict[str, Any]:
    """Recompute the model's full digest; ``status`` becomes ``ready`` or ``corrupt``
    (``problem``: what is wrong)."""
    record, problem = await asyncio.to_thread(
        blobs.verify, core.db, core.settings.blobs_dir, model_id
    )
    core.host.verified(record.digest, problem is None)
    if problem is not None:
        core.host.evict(record)
    return dict(await core.read(shown, core, record), problem=problem)


async def delete(core: Core, actor: Client, model_id: str) -> None:
    """Delete a model (audited): its engine stops, its blob and, when no model uses
    that blob any more, its saved prefixes go."""
    record = await asyncio.to_thread(blobs.delete_model, core.db, core.settings.blobs_dir, model_id)
    gone = {"digest": record.digest}
    await core.db.write(lambda c: audit.record(c, actor.id, "model.removed", model_id, gone))
    core.host.evict(record)
    kv = core.kv
    if kv is not None and not await core.read(
        lambda: models.referenced(core.db.reader(), record.digest)
    ):
        await asyncio.to_thread(kv.forget, record.digest)  # its saved prefixes go too


# -- aliases -------------------------------------------------------------------------------
async def all_aliases(core: Core) -> list[aliases.Alias]:
    return await core.read(lambda: aliases.all_aliases(core.db.reader()))


async def set_alias(core: Core, alias: str, model: str) -> aliases.Alias:
    """Point ``alias`` at ``model`` (replacing what it named)."""
    outcome = await core.db.write(lambda c: aliases.put(c, alias, model))
    if outcome == "missing":
        raise errors.LmspError(
            "model_not_found", f"The model {model!r} does not exist.", param="model"
        )
    if outcome == "taken":
        raise errors.LmspError(
            "model_exists", f"A model is named {alias!r}; an alias cannot hide it.", param="alias"
        )
    return next(a for a in await all_aliases(core) if a.alias == alias)


async def delete_alias(core: Core, alias: str) -> None:
    if not await core.db.write(lambda c: aliases.delete(c, alias)):
        raise errors.not_found("model_alias", alias)
