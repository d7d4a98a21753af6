"""The ``scripted`` target for the SWE-bench fixtures (tests/fixtures/swebench, BENCHMARKS.md §3.11).

Under the fake agent runner the target answers once per instance: the ``resize`` issue gets the
right fix (resolved by the fake harness), the ``__repr__`` issue a diff that applies but only
swaps newlines for spaces (its test still fails), and the ``parse_size`` issue no diff at all
(``wrong: empty patch``). Any other issue gets a reply without a diff.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

RESIZE_FIX = (
    "diff --git a/widgets/core.py b/widgets/core.py\n"
    "index 2b408c4..1cae6d1 100644\n"
    "--- a/widgets/core.py\n"
    "+++ b/widgets/core.py\n"
    "@@ -10,7 +10,7 @@ class Widget:\n"
    "     def resize(self, width: int, height: int | None = None, keep_aspect: bool = False) -> None:\n"
    "         \"\"\"Set the width; the height follows the aspect ratio when keep_aspect is set.\"\"\"\n"
    "         if height is None:\n"
    "-            height = self.height\n"
    "+            height = round(width * self.height / self.width) if keep_aspect else self.height\n"
    "         self.width, self.height = width, height\n"
    " \n"
    "     def __repr__(self) -> str:\n"
)

REPR_PARTIAL_FIX = (
    "diff --git a/widgets/core.py b/widgets/core.py\n"
    "index 2b408c4..367a288 100644\n"
    "--- a/widgets/core.py\n"
    "+++ b/widgets/core.py\n"
    "@@ -14,7 +14,7 @@ class Widget:\n"
    "         self.width, self.height = width, height\n"
    " \n"
    "     def __repr__(self) -> str:\n"
    "-        text = f\"Widget(label='{self.label}')\"\n"
    "+        text = f\"Widget(label='{self.label}')\".replace(\"\\n\", \" \")\n"
    "         if \"\\n\" in text:\n"
    "             raise ValueError(\"a repr must fit on one line\")\n"
    "         return text\n"
)

SCRIPTED_RULES: Sequence[Mapping[str, Any]] = (
    {
        "name": "swebench resize issue: the root-cause fix",
        "stage": "rollout",
        "user": r"Widget\.resize\(\) ignores keep_aspect",
        "text": "The height is never derived from the aspect ratio when keep_aspect is set.\n\n```diff\n"
                + RESIZE_FIX + "```\n",
    },
    {
        "name": "swebench repr issue: a patch that hides the newline",
        "stage": "rollout",
        "user": r"Widget\.__repr__ crashes",
        "text": "Replacing the newline avoids the crash.\n\n```diff\n" + REPR_PARTIAL_FIX + "```\n",
    },
    {
        "name": "swebench other issues: no diff",
        "stage": "rollout",
        "text": "I could not locate the code responsible for this issue, so I have no patch to submit.",
    },
)
