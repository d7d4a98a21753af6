"""The one answer reader of the text benchmarks, on the outputs a small real model wrote.

``qa`` reads the tagged answer, else (by default) a choice item's leading label or option text, or
under ``numeric`` the last number (number words included), and marks such rows ``format: untagged``.
A label whose text contradicts it is never credited, under ``choice`` or ``exact`` scoring.
"""

from __future__ import annotations

import pytest

from skillopt.benchmarks.answers import read_answer, resolve_choice
from skillopt.benchmarks.livemathematicianbench import plugin as livemath
from skillopt.benchmarks.qa import plugin as qa
from skillopt.benchmarks.runner import evaluation_event
from skillopt.core.data import Item

PLAUSIBLE = {"A": "plausible", "B": "implausible"}


def sports_item(scoring: str, **more) -> Item:
    """A BIG-bench-style sports understanding item: the gold is label B (*implausible*)."""
    return Item(id="sports-1",
                question="Is the following sentence plausible? 'Joao Moutinho caught the screen pass.'",
                answers=["B"], context="", choices=["plausible", "implausible"], task_type="sports",
                scoring=scoring, tolerance=1e-6, **more)


def scored(item: Item, reply: str) -> tuple[float, str, str]:
    result = qa.score(item, reply, None)
    return result.hard, result.fail_reason, result.extras.get("format", "tagged")


@pytest.mark.parametrize("scoring", ["choice", "exact"])
def test_an_untagged_label_with_its_text_is_read_and_marked_untagged(scoring):
    hard, fail, fmt = scored(sports_item(scoring), "B. implausible\n\nThe answer is B.")
    assert (hard, fail, fmt) == (1.0, "", "untagged")
    row = qa.score(sports_item(scoring), "B. implausible\n\nThe answer is B.", None)
    assert "format: untagged" in evaluation_event(sports_item(scoring), row)  # the analyst sees the lapse


@pytest.mark.parametrize("scoring", ["choice", "exact"])
def test_a_label_whose_text_contradicts_it_is_never_credited(scoring):
    for reply in ("A. implausible", "<answer>A. implausible</answer>"):
        hard, fail, _ = scored(sports_item(scoring), reply)
        assert hard == 0.0 and "contradicts" in fail, (reply, fail)
    # The consistent label is right, with or without the tag (the old exact scorer had it backwards).
    assert scored(sports_item(scoring), "<answer>B. implausible</answer>")[:2] == (1.0, "")


@pytest.mark.parametrize("reply", ["<answer>B</answer>", "<answer>(B)</answer>", "<answer>B.</answer>",
                                   "<answer>B) implausible</answer>", "<answer>B. implausible</answer>",
                                   "<answer>implausible</answer>", "B) implausible"])
def test_choice_items_accept_the_label_in_every_common_form(reply):
    assert scored(sports_item("choice"), reply)[:2] == (1.0, "")


def test_numeric_reads_number_words_tagged_or_not():
    item = Item(id="legs", question="How many legs does a tripod have?", answers=["3"], context="",
                choices=[],
                task_type="qa", scoring="numeric", tolerance=1e-6)
    assert scored(item, "three") == (1.0, "", "untagged")
    assert scored(item, "<answer>three</answer>") == (1.0, "", "tagged")
    assert scored(item, "<answer>four</answer>")[0] == 0.0


def test_without_the_fallback_an_untagged_reply_is_a_no_answer():
    assert scored(sports_item("choice", answer_fallback=False), "B. implausible\n\nThe answer is B.") == (
        0.0, "no-answer: no <answer> tag", "tagged")
    free_text = Item(id="cap", question="Capital of France?", answers=["Paris"], context="", choices=[],
                     task_type="qa", scoring="exact", tolerance=1e-6)
    # No fallback for free text: the scorer would otherwise have to guess which words are the answer.
    assert scored(free_text, "Paris") == (0.0, "no-answer: no <answer> tag", "tagged")


def test_the_shared_reader_and_resolver():
    assert read_answer("x <answer> B </answer>").text == "B"
    assert read_answer("no tag").text is None and read_answer("no tag").format == "none"
    assert resolve_choice("A. implausible", PLAUSIBLE) is None
    assert resolve_choice("B because it never happens", PLAUSIBLE) == "B"
    assert resolve_choice("b) implausible", PLAUSIBLE) == "B" and resolve_choice("B, so", PLAUSIBLE) is None


def test_livemath_marks_its_last_line_fallback_untagged():
    item = Item(id="m-1", question="Which?", choices=[{"label": "A", "text": "G is cyclic"},
                                                     {"label": "B", "text": "G is abelian"}],
                correct_choice={"label": "B", "text": "G is abelian"}, theorem="", sketch="", task_type="x")
    untagged = livemath.score(item, "Reasoning ...\nB) G is abelian", None)
    assert (untagged.hard, untagged.extras["format"]) == (1.0, "untagged")
    tagged = livemath.score(item, "<answer>B</answer>", None)
    assert (tagged.hard, tagged.extras.get("format", "tagged")) == (1.0, "tagged")
    assert livemath.score(item, "<answer>A. G is abelian</answer>", None).hard == 0.0


@pytest.mark.parametrize("scoring", ["choice", "exact"])
@pytest.mark.parametrize("reply", ["A. plausible\nB. implausible", "plausible\nimplausible",
                                   "B. implausible\nA. plausible", "(A)\n(B)"])
def test_an_untagged_reply_restating_the_options_scores_0_marked_ambiguous(scoring, reply):
    hard, fail, fmt = scored(sports_item(scoring), reply)  # gold B is among the options named
    assert (hard, fmt) == (0.0, "ambiguous") and "more than one option" in fail
    row = qa.score(sports_item(scoring), reply, None)
    assert "format: ambiguous" in evaluation_event(sports_item(scoring), row)


def test_a_tagged_answer_after_the_option_list_is_read_as_tagged():
    hard, _, fmt = scored(sports_item("choice"), "A. plausible\nB. implausible\n<answer>B</answer>")
    assert (hard, fmt) == (1.0, "tagged")


def test_the_summary_counts_untagged_and_ambiguous_answers():
    from skillopt.core.records import ItemResult
    from skillopt.run.runs import answer_format_counts

    replies = ["<answer>B</answer>", "B. implausible", "A. plausible\nB. implausible"]
    results = [qa.score(sports_item("choice"), reply, None) for reply in replies]
    rows = [ItemResult(id=f"s{k}", task_type="sports", hard=r.hard, soft=r.soft, extras=r.extras)
            for k, r in enumerate(results)]
    assert answer_format_counts(rows) == {"rows": 3, "untagged": 1, "ambiguous": 1}


@pytest.mark.parametrize("reply", ["A) G is cyclic\nB) G is abelian", "G is cyclic\nG is abelian",
                                   "Options:\n(A)\n(B)"])
def test_livemath_credits_nothing_for_an_echoed_option_list(reply):
    """The last-line fallback read an echoed list's last option (here the gold, B) as the answer."""
    item = Item(id="m-1", question="Which?", choices=[{"label": "A", "text": "G is cyclic"},
                                                     {"label": "B", "text": "G is abelian"}],
                correct_choice={"label": "B", "text": "G is abelian"}, theorem="", sketch="", task_type="x")
    echoed = livemath.score(item, reply, None)
    assert (echoed.hard, echoed.extras["format"]) == (0.0, "ambiguous")
    reasoning = livemath.score(item, "A cyclic group is abelian, and\nA. G is cyclic does not follow;\n"
                                     "B) G is abelian", None)
    assert (reasoning.hard, reasoning.extras["format"]) == (1.0, "untagged")  # one option line: read
