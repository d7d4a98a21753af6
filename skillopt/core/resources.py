"""Where the shipped prompts and configs live.

In a wheel, the repository's top-level ``prompts/`` and ``configs/`` folders are packaged as
``skillopt/_shipped/{prompts,configs}``; in a source checkout (editable install or tests) they
are read from the repository root. A ``configs/`` folder in the working directory overrides
the shipped configs file by file (see ``config.find_benchmark_config``).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # skillopt/


def shipped_dir(kind: str) -> Path:
    """The folder holding the shipped ``prompts`` or ``configs``."""
    if kind not in ("prompts", "configs"):
        raise ValueError(f"unknown resource kind {kind!r}; expected 'prompts' or 'configs'")
    packaged = _PACKAGE_DIR / "_shipped" / kind
    if packaged.is_dir():
        return packaged
    return _PACKAGE_DIR.parent / kind


def prompt_path(name: str) -> Path:
    """Path of the shipped prompt ``name`` (e.g. ``benchmarks/searchqa/initial_skill``), ``.md`` implied."""
    relative = name if name.endswith(".md") else f"{name}.md"
    path = shipped_dir("prompts") / relative
    if not path.is_file():
        raise FileNotFoundError(f"no shipped prompt named {name!r} (looked for prompts/{relative})")
    return path


def load_prompt(name: str) -> str:
    """The text of the shipped prompt ``name``."""
    return prompt_path(name).read_text(encoding="utf-8")


def shipped_config_names() -> list[str]:
    """Names of the shipped benchmark configs (without ``.yaml``), ``_base_`` excluded."""
    return sorted(p.stem for p in shipped_dir("configs").glob("*.yaml") if not p.stem.startswith("_"))
