"""The remote-engine tests need a built ``llama-server`` (tests/upstream.py): without it
they skip with the way to build it, unless ``LMSP_REQUIRE_LLAMA_SERVER=1`` (CI, which
builds it first in ``.ci/run``), where they fail — a missing binary never passes
quietly there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import upstream


def test_a_missing_llama_server_skips_saying_how_to_build_it_or_fails_when_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(upstream.llama_server, "binary_path", lambda v: tmp_path / "none")
    monkeypatch.setattr(upstream, "REQUIRED", False)
    with pytest.raises(pytest.skip.Exception, match=r"bench/llama_server\.py"):
        upstream.binary()
    monkeypatch.setattr(upstream, "REQUIRED", True)
    with pytest.raises(pytest.fail.Exception, match="LMSP_REQUIRE_LLAMA_SERVER=1"):
        upstream.binary()
    built = tmp_path / "llama-server"
    built.write_bytes(b"")
    monkeypatch.setattr(upstream.llama_server, "binary_path", lambda v: built)
    assert upstream.binary() == built
