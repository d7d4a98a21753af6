"""Process checks the tests share."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie (a killed process stays one until it is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
