"""Adding a remote model: a model an upstream (llama-server, vLLM, SGLang) serves, with
lmsp's control plane in front (docs/remote-engines.md).

Before anything is written: the tokenizer file is read (a GGUF, its vocabulary only, or
a ``tokenizer.json``: :mod:`lmsp.engines.hf_tokenizer`; one a hub reference names is
fetched first, small: :mod:`lmsp.outbound.hub_tokenizer`),
the upstream is probed for what it can do (:func:`lmsp.engines.upstream.probe`), and its
``/tokenize`` must give the same tokens as the local tokenizer on a set of samples
(plain, accented, CJK and emoji text, the chat template's special tokens) — prompts go
to the upstream as token ids and text comes back decoded from ids, so a tokenizer that
differs would change every answer. Any problem is a ``400`` naming it; only then is the
tokenizer copied into the blob store and the record written, with the upstream and its
capabilities.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from lmsp import errors
from lmsp.app.core import Core
from lmsp.datadir import ensure_private_dir
from lmsp.engines.hf_tokenizer import GGUF_MAGIC, JsonTokenizer, read_config
from lmsp.engines.llama_cpp import LlamaTokenizer
from lmsp.engines.upstream import Probe, RemoteSpec, UpstreamLost, UpstreamRefused, probe
from lmsp.outbound import hub_tokenizer
from lmsp.outbound.hub import Hub, is_reference
from lmsp.store import blobs, models
from lmsp.store.models import ModelRecord

log = logging.getLogger(__name__)


#: texts both tokenizers must agree on (raw prompts: special tokens read as such)
SAMPLES = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  Leading spaces, tabs\tand\nnew lines; numbers 12345 and 3.14159.",
    "Accents: café, naïve, Ærøskøbing. Greek: αβγ. Cyrillic: привет.",
    "CJK: 日本語のテキスト, 中文文本. Emoji: 🙂🚀👍🏽.",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    "<|im_start|>assistant\n",
    'def f(x):\n    return {"a": [1, 2, 3], "b": None}  # code',
)


def _local_tokenizer(path: Path) -> tuple[LlamaTokenizer | JsonTokenizer, dict[str, Any]]:
    """The tokenizer ``path`` names on the service's machine — a GGUF (its vocabulary) or
    a ``tokenizer.json`` (with the configuration beside it) — and what the record keeps
    of that configuration."""
    source, _ = blobs.open_source(path)  # the same refusal as an import for a bad path
    with source:
        gguf = source.read(4) == GGUF_MAGIC
    try:
        if gguf:
            return LlamaTokenizer(path, 0), {}
        config = read_config(path)
        return JsonTokenizer(path, config), config
    except Exception as exc:  # its words (paths) go to the log only
        log.info("reading a tokenizer failed: %s", exc)
        raise errors.invalid(
            "The tokenizer is neither a GGUF file whose vocabulary can be read nor a "
            "tokenizer.json (with its tokenizer_config.json beside it) that the tokenizers "
            "library reads.",
            "tokenizer",
        ) from None


def _checker(tokenizer: LlamaTokenizer | JsonTokenizer) -> Any:
    def check(upstream: Probe, dialect: str) -> None:
        for i, text in enumerate(SAMPLES):
            local = tokenizer.raw_tokens(text)
            remote = upstream.tokenize(dialect, text)
            if local != remote:
                at = next(
                    (k for k, (a, b) in enumerate(zip(local, remote, strict=False)) if a != b),
                    min(len(local), len(remote)),
                )
                raise errors.invalid(
                    f"The tokenizer does not match the upstream's: sample {i + 1} of "
                    f"{len(SAMPLES)} differs at token {at} (local {local[at : at + 4]}, "
                    f"upstream {remote[at : at + 4]}). Give the tokenizer of the model the "
                    "upstream serves.",
                    "tokenizer",
                    code="tokenizer_mismatch",
                )

    return check


def add_remote(
    core: Core,
    model_id: str,
    tokenizer: str,
    given: dict[str, Any],
    defaults: dict[str, float | int] | None = None,
) -> ModelRecord:
    """``POST /v1/models`` with ``remote``: probe, check, then import (see the module
    docstring; in a worker thread). ``tokenizer``: a local file, or a hub reference
    fetched first (:mod:`lmsp.outbound.hub_tokenizer`). ``given``: ``url``,
    ``upstream_model``, ``api_key_env``, ``inflight``."""
    if models.get(core.db.reader(), model_id) is not None:
        raise errors.LmspError("model_exists", f"A model {model_id!r} exists.", param="id")
    spec = RemoteSpec.of(given)
    if is_reference(tokenizer):
        return _add_fetched(core, model_id, tokenizer, spec, defaults)
    if tokenizer.strip().lower().startswith(("http:", "https:")):
        raise errors.invalid(
            "A remote model's tokenizer is a file on the service's machine (a GGUF or a "
            "tokenizer.json) or a hub reference, hf.co/{owner}/{repo}[:{quant}]; no other "
            "address is fetched.",
            "tokenizer",
        )
    return _add(core, model_id, Path(tokenizer), spec, defaults)


def _add_fetched(
    core: Core,
    model_id: str,
    reference: str,
    spec: RemoteSpec,
    defaults: dict[str, float | int] | None,
) -> ModelRecord:
    """The tokenizer a hub reference names, fetched into the data directory's
    ``fetching`` folder (removed once the model is added, or refused; what a crash left
    there is removed by a later fetch), then as a file."""
    fetching = core.settings.data_dir / "fetching"
    ensure_private_dir(fetching)
    for left in fetching.iterdir():  # older than any fetch still under way
        if left.stat().st_mtime < time.time() - 2 * hub_tokenizer.FETCH_FOR:
            shutil.rmtree(left, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="tokenizer-", dir=fetching) as into:
        with Hub(core.settings.hf_endpoint, core.settings.hf_token) as hub:
            fetched = hub_tokenizer.fetch(hub, reference, Path(into))
        log.info("fetched the tokenizer of %s from %s", model_id, fetched.origin)
        spec = replace(spec, tokenizer_origin=fetched.origin)
        return _add(core, model_id, fetched.path, spec, defaults)


def _add(
    core: Core,
    model_id: str,
    tokenizer_path: Path,
    spec: RemoteSpec,
    defaults: dict[str, float | int] | None,
) -> ModelRecord:
    tokenizer, config = _local_tokenizer(tokenizer_path)
    try:
        sample = tokenizer.raw_tokens(SAMPLES[0])
        found = [probe(spec.at(url), sample, _checker(tokenizer)) for url in spec.urls]
        capabilities = combined(found)
    except UpstreamLost as exc:
        raise errors.invalid(
            f"The upstream could not be reached: {exc}", "remote.url", code="upstream_unreachable"
        ) from None
    except UpstreamRefused as exc:
        raise errors.invalid(
            f"The upstream is of no use here: {exc}", "remote.url", code="upstream_refused"
        ) from None
    finally:
        tokenizer.close()
    slots = int(capabilities.get("slots") or 0)
    if slots and spec.inflight > slots:
        raise errors.invalid(
            f"inflight {spec.inflight} is more than the upstreams' {slots} sequences "
            "(llama-server's -np): its extra requests would only wait there.",
            "remote.inflight",
        )
    stored = replace(spec, capabilities=capabilities, tokenizer_config=config).stored()
    return blobs.import_model(
        core.db, core.settings.blobs_dir, model_id, tokenizer_path, defaults=defaults, remote=stored
    )


def combined(found: list[dict[str, Any]]) -> dict[str, Any]:
    """What a model's upstreams can all do: the least context, every slot, each ability
    only if every replica has it; replicas of different kinds are refused."""
    first = found[0]
    if any(f["dialect"] != first["dialect"] for f in found):
        raise UpstreamRefused("its replicas are not all the same kind of server")
    out: dict[str, Any] = {}
    for name, value in first.items():
        values = [f.get(name) for f in found]
        if isinstance(value, bool):
            out[name] = all(bool(v) for v in values)
        elif name == "slots":
            out[name] = sum(int(v or 0) for v in values)
        elif name == "n_ctx":
            out[name] = min(int(v or 0) for v in values)
        else:
            out[name] = value
    return out
