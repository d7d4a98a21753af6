"""Convert a BIG-bench JSON task (``task.json`` with ``examples`` of ``input`` and ``target_scores``), or a
BIG-Bench Hard one (``examples`` of ``input`` and ``target``), into the ``qa`` benchmark's JSONL: one row per
example, the question with the task's prefix, the best-scored target as the answer.

    python bench/bigbench_to_qa.py TASK_JSON OUT_JSONL [--limit N] [--id-prefix sports] [--choices]
    python bench/bigbench_to_qa.py BBH_TASK_JSON OUT_JSONL --limit 30 --options yes,no

``--choices`` gives each item the options of its ``target_scores``; ``--options`` gives every item the same
options (for a BIG-Bench Hard task, whose examples have none).

The BIG-bench data stays where it was downloaded; nothing of it is committed here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def convert(task: dict, *, limit: int, id_prefix: str, choices: bool = False,
            options: list[str] | None = None) -> list[dict]:
    prefix = str(task.get("task_prefix") or "").strip()
    rows = []
    for number, example in enumerate(task["examples"][: limit or None], start=1):
        scores = example.get("target_scores") or {}
        if scores:
            answer = max(scores, key=lambda option: scores[option])
        else:
            target = example["target"]
            answer = target[0] if isinstance(target, list) else target
        question = f"{prefix}\n{example['input']}".strip() if prefix else str(example["input"])
        row = {"id": f"{id_prefix}-{number:04d}", "question": question, "answer": answer}
        if choices and scores:
            row["choices"] = list(scores)  # the gold is then read as its option (qa's choice scoring)
        elif options:
            if answer not in options:
                raise SystemExit(f"example {number}: target {answer!r} is not one of --options {options}")
            row["choices"] = list(options)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task_json", type=Path)
    parser.add_argument("out_jsonl", type=Path)
    parser.add_argument("--limit", type=int, default=0, help="first N examples only (0: all)")
    parser.add_argument("--id-prefix", default="item")
    parser.add_argument("--choices", action="store_true", help="give each item its options")
    parser.add_argument("--options", default="", help="comma-separated options for every item, e.g. yes,no")
    args = parser.parse_args()
    task = json.loads(args.task_json.read_text(encoding="utf-8"))
    options = [option.strip() for option in args.options.split(",") if option.strip()]
    rows = convert(task, limit=args.limit, id_prefix=args.id_prefix, choices=args.choices, options=options)
    args.out_jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    print(f"{args.out_jsonl}: {len(rows)} rows")


if __name__ == "__main__":
    main()
