"""The shared answer helpers (skillopt.benchmarks.answers): tag and box extraction, SQuAD metrics, numbers."""

from __future__ import annotations

import pytest

from skillopt.benchmarks.answers import (
    best_f1,
    exact_match,
    last_boxed,
    last_number,
    last_tag,
    normalise_squad,
    quote_answer,
    sub_exact_match,
    token_f1,
)

# ------------------------------------------------------------------------------------------ last_tag


def test_last_complete_answer_tag_wins():
    assert last_tag("<answer>Lyon</answer> on second thought <answer>Paris</answer>") == "Paris"


def test_answer_tag_matches_case_insensitively_and_across_newlines():
    assert last_tag("reasoning\n<ANSWER>\n  two\nlines  \n</Answer>") == "two\nlines"


def test_an_unclosed_last_tag_leaves_the_last_complete_pair():
    assert last_tag("<answer>B</answer> then <answer>C") == "B"
    assert last_tag("<answer>x <answer>y</answer>") == "y"


def test_no_tag_is_none_and_an_empty_tag_is_empty():
    assert last_tag("the answer is Paris") is None
    assert last_tag("") is None
    assert last_tag("<answer>  </answer>") == ""


def test_last_tag_reads_other_tag_names():
    assert last_tag("<action>look</action><action>go to desk 1</action>", "action") == "go to desk 1"


# ---------------------------------------------------------------------------------------- last_boxed


def test_boxed_keeps_balanced_nested_braces():
    assert last_boxed(r"so \boxed{\frac{1}{2}} is it") == r"\frac{1}{2}"


def test_the_last_box_wins_and_an_unbalanced_one_is_skipped():
    assert last_boxed(r"\boxed{A} no, \boxed{C}") == "C"
    assert last_boxed(r"\boxed{A} and then \boxed{B") == "A"


def test_a_box_inside_a_box_belongs_to_the_outer_one():
    assert last_boxed(r"\boxed{\boxed{3}}") == r"\boxed{3}"


def test_begin_of_box_tokens_are_accepted_and_compete_by_position():
    assert last_boxed("answer: <|begin_of_box|> 7 <|end_of_box|>") == "7"
    assert last_boxed(r"<|begin_of_box|>A<|end_of_box|> later \boxed{B}") == "B"
    assert last_boxed(r"\boxed{B} later <|begin_of_box|>A<|end_of_box|>") == "A"


def test_no_box_is_none():
    assert last_boxed("C") is None
    assert last_boxed(r"\boxed{") is None


# ------------------------------------------------------------------------------------- SQuAD metrics


def test_squad_normalisation_drops_case_punctuation_articles_and_extra_space():
    assert normalise_squad("  The Sun, Also   Rises! ") == "sun also rises"
    assert normalise_squad("An apple a day") == "apple day"
    assert normalise_squad("theater") == "theater"  # only whole-word articles go


def test_exact_match_is_normalised_equality_with_any_gold():
    assert exact_match("Sun Also Rises", ["The Sun Also Rises"])
    assert exact_match("praha.", ["Prague", "Praha"])
    assert not exact_match("Prague, Czechia", ["Prague", "Praha"])
    assert not exact_match("Paris", [])


def test_token_f1_values():
    assert token_f1("The city of Paris", "Paris") == pytest.approx(0.5)
    assert token_f1("Prague, Czechia", "Prague") == pytest.approx(2 / 3)
    assert token_f1("Lyon", "Paris") == 0.0
    assert token_f1("the", "a") == 1.0  # both sides normalise to nothing
    assert token_f1("", "Paris") == 0.0


def test_best_f1_takes_the_best_gold():
    assert best_f1("Prague, Czechia", ["Praha", "Prague"]) == pytest.approx(2 / 3)
    assert best_f1("anything", []) == 0.0


def test_sub_exact_match_is_containment_either_way():
    assert sub_exact_match("Prague, Czechia", ["Prague"])
    assert sub_exact_match("Sun", ["The Sun Also Rises"])
    assert not sub_exact_match("Brno", ["Prague"])
    assert not sub_exact_match("the", ["Prague"])  # an empty prediction contains nothing


# -------------------------------------------------------------------------------------------- numbers


def test_last_number_ignores_thousands_commas_currency_and_percent():
    assert last_number("$1,234.50 then 12.37%") == pytest.approx(12.37)
    assert last_number("about €255,724 million") == 255724
    assert last_number("-3.5") == -3.5
    assert last_number("8.0") == 8.0
    assert last_number("eight") == 8 and last_number("three") == 3
    assert last_number("twenty-one apples, not 3") == 3 and last_number("3, then twenty one") == 21
    assert last_number("someone gave none") is None  # whole words only


def test_quote_answer_is_one_bounded_line():
    assert quote_answer("a\n  b") == "a b"
    assert quote_answer("x" * 500, limit=10) == "xxxxxxx..."
