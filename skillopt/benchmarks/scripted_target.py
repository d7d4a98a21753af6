"""Where the ``scripted`` backend's ``auto`` set finds its target replies for a benchmark run.

Scripted replies are data, not part of a plug-in: a data folder may hold a rules file
``scripted_rules.yaml`` (a YAML list of ``scripted`` rules, the format ``skillopt.llm.scripted``
documents; the ``question`` key matches the item's first user message, so a reply stays the same
over self-check turns). When the run's data root holds one, ``--backend scripted`` answers as the
target from it, so ``skillopt train <id> --data tests/fixtures/<id> --backend scripted`` trains
offline. The data root is ``split_dir`` in split_dir mode, else ``data_root``, else the folder of
``data_path``. The ``demo`` benchmark, whose items are generated, keeps its simulated target
(``skillopt.benchmarks.demo.scripted``) as a built-in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

#: The rules file the ``auto`` set reads from a run's data root.
RULES_FILE = "scripted_rules.yaml"
#: Target rules of benchmarks whose items are generated rather than read from a data root.
BUILTIN_TARGET_RULES: dict[str, tuple[dict[str, Any], ...]] = {
    "demo": ({"name": "demo target", "stage": "rollout",
              "handler": "skillopt.benchmarks.demo.scripted:target"},),
}


def rules_file(bench_cfg: BaseModel) -> Path | None:
    """The ``scripted_rules.yaml`` of the run's data root, or None when there is none."""
    split_dir, data_root, data_path = (getattr(bench_cfg, key, None)
                                       for key in ("split_dir", "data_root", "data_path"))
    folders = [split_dir if getattr(bench_cfg, "split_mode", None) != "ratio" else None, data_root,
               Path(data_path).parent if data_path and Path(data_path).is_file() else data_path]
    for folder in folders:
        if folder and (Path(folder) / RULES_FILE).is_file():
            return Path(folder) / RULES_FILE
    return None


def target_rules(benchmark_id: str, bench_cfg: BaseModel) -> tuple[dict[str, Any], ...]:
    """The target rules the ``auto`` set uses for this run: the data root's rules file, else the
    benchmark's built-in rules, else none (a scripted rollout then has no reply)."""
    found = rules_file(bench_cfg)
    if found is not None:
        import yaml

        from skillopt.core.errors import ConfigError
        from skillopt.llm.scripted import parse_rules

        try:
            rules = yaml.safe_load(found.read_text(encoding="utf-8")) or []
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{found}: cannot read the scripted rules: {exc}") from None
        if not isinstance(rules, list):
            raise ConfigError(f"{found}: scripted rules must be a YAML list of rules")
        if not rules:
            raise ConfigError(f"{found}: holds no scripted rules, so the scripted target has no reply for "
                              "any item; write its rules (docs/new-benchmark.md) or delete the file")
        parse_rules(rules, where=str(found))  # a bad rule is named now, with its file, not item by item
        return tuple(rules)
    return BUILTIN_TARGET_RULES.get(benchmark_id, ())
