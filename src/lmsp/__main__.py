from __future__ import annotations

from lmsp.cli import main

main(prog_name="lmsp")
