"""The crash campaign (see :mod:`tests.campaigns.crash`): 20 kills in ``make test``,
200 in ``make torture``. ``LMSP_CRASH_SEED`` replays a run."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.campaigns import crash
from tests.campaigns.invariants import long_run, report

pytestmark = pytest.mark.slow


def test_crash_campaign(tmp_path: Path, blob_cache: Path) -> None:
    kills = 200 if long_run() else 20
    seed = int(os.environ.get("LMSP_CRASH_SEED", random.randrange(2**32)))
    started = time.monotonic()
    figs = crash.run(tmp_path, blob_cache, kills, seed, race_every=1 if long_run() else 2)
    report(crash.summary(figs, time.monotonic() - started) + f" [LMSP_CRASH_SEED={seed}]")
    assert figs.kills == kills
    assert not figs.violations, figs.violations[:20]
    assert figs.races and figs.race_refusals == figs.races
    assert figs.accepted > kills and sum(figs.cells.values()) > 0
