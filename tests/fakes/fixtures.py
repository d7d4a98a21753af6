"""Pytest fixtures for the loopback fakes; a conftest imports them (``from tests.fakes.fixtures import *``).

- ``openai_server``: a started ``FakeOpenAIServer``, fresh for each test, stopped (threads joined) at
  teardown.
- ``anthropic_server``: the same for ``FakeAnthropicServer``.
- ``socket_guard``: the test runs with non-loopback connections refused; yields the ``SocketGuard``.
- ``editable_prompts``: skillopt reads a private copy of the shipped prompts and configs; yields its
  ``prompts``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from .http_fakes import FakeAnthropicServer, FakeOpenAIServer
from .socket_guard import socket_guard

__all__ = ["anthropic_server", "openai_server", "socket_guard"]


@pytest.fixture
def openai_server() -> Iterator[FakeOpenAIServer]:
    """A fresh OpenAI/Azure fake on 127.0.0.1; point SDKs at ``.openai_base_url`` (Azure: ``.url``)."""
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def anthropic_server() -> Iterator[FakeAnthropicServer]:
    """A fresh Anthropic fake on 127.0.0.1; point the SDK at ``.url``."""
    with FakeAnthropicServer() as server:
        yield server


@pytest.fixture
def editable_prompts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private, editable copy of the shipped prompts and configs that skillopt reads for this test."""
    import skillopt.core.resources as resources

    package = tmp_path / "package"
    (package / "skillopt").mkdir(parents=True)
    for kind in ("prompts", "configs"):
        shutil.copytree(resources.shipped_dir(kind), package / kind)
    monkeypatch.setattr(resources, "_PACKAGE_DIR", package / "skillopt")
    assert resources.shipped_dir("prompts") == package / "prompts"
    return package / "prompts"
