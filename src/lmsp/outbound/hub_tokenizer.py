"""A remote model's tokenizer named by a hub reference (``hf.co/{owner}/{repo}[:{quant}]``),
fetched when the model is added (docs/remote-engines.md), small: never the weights.

- Without a quantization, a repository with a ``tokenizer.json`` (a Hugging Face model,
  as vLLM and SGLang serve them): that file and the configuration beside it
  (``tokenizer_config.json``, ``generation_config.json``). Each is checked against the
  hash the hub lists for it: the SHA-256 of a large (LFS) file, the git blob hash of
  another.
- A quantization named, or a repository of GGUF files only (as llama-server serves
  them): the head of that quantization's GGUF file (of any, the vocabulary being the same
  in each), read until its metadata ends — the vocabulary is in it — and written as a
  GGUF without tensors, which llama.cpp's tokenizer loads. Its hash cannot be checked (the
  hub's covers the weights); like any tokenizer, it is checked against the upstream's own
  ``/tokenize`` before anything is written.

The files go to a directory the caller gives and removes; the revision they were read at
is named in :attr:`Fetched.origin`.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmsp import errors, gguf
from lmsp.outbound.hub import DEFAULT_QUANT, FailedAttempt, Hub, pick_files, split_reference

#: what the API names the tokenizer's field (``path`` of ``POST /v1/models``)
PARAM = "tokenizer"
#: the largest ``tokenizer.json`` (or configuration file) fetched
MAX_FILE = 64 << 20
#: the most of a GGUF file read for its metadata (a 256k vocabulary takes ~10 MiB)
MAX_HEAD = 128 << 20
#: seconds a tokenizer's files may take to come, all of them
FETCH_FOR = 300.0
#: the files read beside a ``tokenizer.json`` when the repository has them
BESIDE = ("tokenizer_config.json", "generation_config.json")


@dataclass(frozen=True)
class Fetched:
    """The tokenizer file fetched (a ``tokenizer.json``, or a GGUF without tensors) and
    where it came from: ``hf.co/{repo}@{revision}/{file}``."""

    path: Path
    origin: str


def fetch(hub: Hub, reference: str, into: Path) -> Fetched:
    """Fetch the tokenizer ``reference`` names into the directory ``into``, within
    :data:`FETCH_FOR` seconds. A reference that names nothing usable is a ``400`` for the
    tokenizer; a hub that answers wrong or too slowly, a ``hub_error``."""
    timer = threading.Timer(FETCH_FOR, hub.abort)  # a hub that trickles is cut off
    timer.daemon = True
    timer.start()
    try:
        return _fetch(hub, reference, into)
    finally:
        timer.cancel()


def _fetch(hub: Hub, reference: str, into: Path) -> Fetched:
    try:
        repo, quant = split_reference(reference, PARAM)
        revision, tree = hub.tree(repo)
        files = {str(e.get("path")): e for e in tree if e.get("type", "file") == "file"}
        into.mkdir(parents=True, exist_ok=True)
        if quant is None and "tokenizer.json" in files:
            for name in ("tokenizer.json", *BESIDE):
                if name in files:
                    _whole(hub, repo, revision, files[name], into / name)
            return Fetched(into / "tokenizer.json", f"hf.co/{repo}@{revision}/tokenizer.json")
        name = _gguf_of(tree, quant)
        target = into / name.rsplit("/", 1)[-1]
        _vocabulary(hub, hub.file_url(repo, revision, name), target)
        return Fetched(target, f"hf.co/{repo}@{revision}/{name}")
    except errors.LmspError as exc:
        if exc.param == "from":  # the hub's refusals name a pull's field
            exc.param = PARAM
        raise


def _gguf_of(tree: list[dict[str, Any]], quant: str | None) -> str:
    """The GGUF file whose head holds the vocabulary: the quantization's (its first part
    when split), else the default quantization's, else the first GGUF file listed."""
    if quant is not None:
        return pick_files(tree, quant)[0].path
    names = sorted(
        str(e.get("path"))
        for e in tree
        if str(e.get("path", "")).lower().endswith(".gguf")
        and "mmproj" not in str(e.get("path", "")).lower()
    )
    if not names:
        raise errors.invalid("The repository has neither a tokenizer.json nor a GGUF file.", PARAM)
    try:
        return pick_files(tree, DEFAULT_QUANT)[0].path
    except errors.LmspError:
        firsts = [n for n in names if not re.search(r"-\d{5}-of-\d{5}\.gguf$", n, re.I)]
        firsts += [n for n in names if re.search(r"-00001-of-\d{5}\.gguf$", n, re.I)]
        return (firsts or names)[0]


def _read(hub: Hub, url: str, limit: int, enough: Any = None) -> bytes:
    """The bytes of ``url`` from its start, at most ``limit``; the read stops early once
    ``enough(bytes so far)`` is true."""
    got = bytearray()
    try:
        with hub.open_range(url, 0) as (_, chunks):
            for chunk in chunks:
                got += chunk
                if len(got) > limit or (enough is not None and enough(bytes(got))):
                    break
    except FailedAttempt as exc:
        why = exc.what
    else:
        if not hub.aborted.is_set():
            return bytes(got)
    if hub.aborted.is_set():  # cut off (:data:`FETCH_FOR`): what came is not the file
        why = f"it took over {FETCH_FOR:g} s"
    raise errors.LmspError("hub_error", f"The hub did not send the tokenizer's file: {why}.")


def _whole(hub: Hub, repo: str, revision: str, entry: dict[str, Any], target: Path) -> None:
    """A small file of the repository, checked against the hash the hub lists."""
    name = str(entry["path"])
    data = _read(hub, hub.file_url(repo, revision, name), MAX_FILE)
    if len(data) > MAX_FILE:
        raise errors.invalid(f"The repository's {name} is over {MAX_FILE} bytes.", PARAM)
    lfs = entry.get("lfs") or {}
    if lfs:
        listed, found = str(lfs.get("oid") or lfs.get("sha256")), hashlib.sha256(data).hexdigest()
    else:
        listed = str(entry.get("oid"))
        found = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
    if found != listed:
        raise errors.LmspError(
            "hub_error",
            f"The hub sent a {name} that is not the file it lists (its hash differs).",
        )
    target.write_bytes(data)


def _vocabulary(hub: Hub, url: str, target: Path) -> None:
    """The head of a GGUF file, read until its metadata ends, written as a GGUF without
    tensors (:func:`lmsp.gguf.vocabulary_only`)."""

    def whole(head: bytes) -> bool:
        return _metadata(head) is not None

    head = _read(hub, url, MAX_HEAD, whole)
    found = _metadata(head)
    if found is None:
        raise errors.invalid(
            f"The GGUF file's metadata ends past its first {MAX_HEAD} bytes, or the file "
            "ends before it.",
            PARAM,
        )
    values, end = found
    alignment = values.get("general.alignment", gguf.DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or not 1 <= alignment <= 1 << 16:
        raise errors.invalid("The GGUF file's alignment is not a usable number.", PARAM)
    target.write_bytes(gguf.vocabulary_only(head, end, alignment))


def _metadata(head: bytes) -> tuple[dict[str, Any], int] | None:
    try:
        return gguf.metadata_end(head)
    except gguf.NotGGUF as exc:
        raise errors.invalid(f"The repository's GGUF file is not one: {exc}.", PARAM) from None
