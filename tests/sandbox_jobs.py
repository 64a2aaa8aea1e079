"""Jobs for tests/test_sandbox.py, run in sandbox workers (importable by reference)."""

from __future__ import annotations

import os
import sys
import time


def echo(value: object) -> object:
    return value


def spin() -> None:
    while True:
        pass


def allocate(megabytes: int) -> int:
    return len(bytearray(megabytes << 20))


def sleep(seconds: float) -> str:
    time.sleep(seconds)
    return "woke"


def die() -> None:
    os.abort()


def shout(lines: int) -> int:
    for i in range(lines):
        print(f"noise {i}", file=sys.stderr)
    return lines


def fail() -> None:
    raise ValueError("a parser gave up")


def pid() -> int:
    return os.getpid()
