"""Headless Chromium for the browser tests: Debian's ``chromium`` driven by Playwright (no browser download).

``chromium()`` yields a launched browser. Where the binary or the ``playwright`` package is missing the
test is skipped with the reason, except under CI (``CI=true``), where ``.ci/run`` installs both and a
missing one is a failure. Screenshots go to ``test-artifacts/`` at the repository root (git-ignored;
CI keeps the folder).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI must run the browser tests (.ci/run installs Debian's chromium)")
    pytest.skip(reason)


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        _unavailable("no chromium binary on PATH (apt-get install -y chromium)")
    return path  # type: ignore[return-value]


@contextmanager
def chromium() -> Iterator[Any]:
    executable = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (pip install -e '.[dev]')")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot as ``test-artifacts/<name>.png`` and say where."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path
