"""Named target models (``model.targets``): the named block replaces ``model.target`` and keeps its own
backend and model against the command line's ``--backend`` / ``--model``."""

from __future__ import annotations

import pytest

from skillopt.core.config import load_config
from skillopt.core.errors import ConfigError
from skillopt.llm.base import BackendRegistry
from skillopt.llm.roles import CliRoleOptions, resolve_roles
from skillopt.run.targets import check_targets, with_target


def test_a_named_target_replaces_model_target_and_keeps_its_backend_against_the_command_line():
    loaded = load_config("demo", overrides=["model.targets.big={backend: openai, model: gpt-4.1}"], env={})
    named, roles = with_target(loaded, {"backend": "scripted", "model": "other"}, "big")
    resolved = resolve_roles(named, cli=CliRoleOptions(**roles), env={"OPENAI_API_KEY": "x"},
                             registry=BackendRegistry.default())
    assert (resolved.target.backend, resolved.target.model) == ("openai", "gpt-4.1")
    assert resolved.optimizer.backend == "scripted"  # --backend still applies to the other roles
    assert named.source_of("model.target.backend").startswith("-o ")
    assert loaded.config.model.target.backend == "scripted"  # the original config is left as it was


def test_the_demo_targets_differ_in_their_rules_and_so_in_their_cache_identity():
    loaded = load_config("demo", env={})
    fingerprints = set()
    for name in ("scripted_a", "scripted_b"):
        named, roles = with_target(loaded, {}, name)
        resolved = resolve_roles(named, cli=CliRoleOptions(**roles), env={},
                                 registry=BackendRegistry.default())
        fingerprints.add(resolved.target.fingerprint())
    assert len(fingerprints) == 2


def test_an_unknown_name_lists_the_defined_ones():
    loaded = load_config("demo", env={})
    with pytest.raises(ConfigError, match=r"unknown model config 'gpt9'; model.targets defines: scripted_a, "
                                          r"scripted_b"):
        check_targets(loaded.config, ["scripted_a", "gpt9"])


def test_a_provider_entry_for_the_configured_target_stands_while_a_named_target_replaces_it():
    """A limit for model.target's server is in use in the config's own runs; an evaluation on a named target
    (transfer, compare --target) does not call that server, and is not refused for it."""
    loaded = load_config("demo", env={}, overrides=[
        "model.target={backend: openai_compatible, base_url: 'http://127.0.0.1:8000/v1', model: m}",
        "model.providers={'openai_compatible:127.0.0.1:8000': {max_concurrency: 1}}"])
    registry = BackendRegistry.default()
    assert resolve_roles(loaded, env={}, registry=registry).target.rate_limit_key == \
        "openai_compatible:127.0.0.1:8000"
    named, roles = with_target(loaded, {}, "scripted_a")
    resolved = resolve_roles(named, cli=CliRoleOptions(**roles), env={}, registry=registry)
    assert resolved.target.backend == "scripted"
