"""Trajectories within a budget: whole when they fit; otherwise the middles of the longest fields are elided
with a visible marker, and the question's end, the final answer, tool results' tails, the evaluation and the
reference survive. Long questions, long reasoning and multi-turn items; prompts of every evidence-heavy
stage."""

from __future__ import annotations

import re

from skillopt.core.records import ItemResult
from skillopt.optimizer.reflect import analyst_request
from skillopt.optimizer.slow_update import pair_by_id, slow_update_request
from skillopt.optimizer.trajectory import elide_middle, fit_trajectories, format_trajectory

MARKER = re.compile(r"\[… (\d+) characters elided …\]")


def row(item_id: str, events: list[dict], *, solved: bool = False, reference: str = "C",
        predicted: str = "B") -> ItemResult:
    evaluation = f"[EVALUATION RESULT] predicted: {predicted}\nexpected: {reference}\nverdict: wrong"
    return ItemResult(
        id=item_id,
        task_type="mc",
        hard=float(solved),
        soft=float(solved),
        fail_reason="" if solved else f"wrong: predicted {predicted!r}",
        task_description=events[0].get("content", "") if events else "",
        predicted_answer=predicted,
        trajectory=[*events, {"type": "evaluation", "content": evaluation}],
    )


def long_question_row(item_id: str = "q") -> ItemResult:
    context = " ".join(f"filler sentence {k} about nothing in particular." for k in range(400))  # ~17k chars
    question = (f"{context}\nDECISIVE: the bridge was finished in 1932.\nWhen was it finished?\n"
                "(A) 1901 (B) 1921 (C) 1932")
    return row(item_id, [
        {"type": "message", "role": "system", "content": "SKILL"},
        {"type": "message", "role": "user", "content": question},
        {"type": "message", "role": "assistant", "content": "The answer is <answer>B</answer>"},
    ])


def long_reasoning_row(item_id: str = "r") -> ItemResult:
    reasoning = (
        " ".join(f"step {k}: consider the case carefully." for k in range(300))
        + " FINAL ANSWER: <answer>B</answer>"
    )
    return row(item_id, [
        {"type": "message", "role": "user", "content": "Which option? (A) x (B) y (C) z"},
        {"type": "message", "role": "assistant", "content": reasoning},
    ])


def multi_turn_row(item_id: str = "m", turns: int = 60) -> ItemResult:
    events: list[dict] = [
        {"type": "message", "role": "user", "content": "Find the file and report its size."}
    ]
    for k in range(turns):
        events.append({"type": "tool_call", "command": f"ls dir{k}",
                       "observation": "x" * 400 + f" TAIL{k}: 12 bytes"})
    events.append({"type": "message", "role": "assistant", "content": "<answer>12</answer>"})
    return row(item_id, events, reference="12", predicted="12")


def test_a_trajectory_that_fits_is_shown_whole():
    block = format_trajectory(long_question_row(), index=1, max_chars=100_000)
    assert block == format_trajectory(long_question_row(), index=1)
    assert not MARKER.search(block) and "filler sentence 399" in block


def test_a_long_question_keeps_its_end_and_the_answer_and_marks_what_was_elided():
    item = long_question_row()
    block = format_trajectory(item, index=1, max_chars=3000)
    assert len(block) <= 3000
    assert (
        "DECISIVE: the bridge was finished in 1932. / When was it finished? / (A) 1901 (B) 1921 (C) 1932"
        in block
    )
    assert "The answer is <answer>B</answer>" in block
    assert block.endswith("[EVALUATION RESULT] predicted: B\nexpected: C\nverdict: wrong")
    elided = sum(int(n) for n in MARKER.findall(block))
    assert elided > 0 and "filler sentence 0 " in block  # the start is kept too


def test_long_reasoning_keeps_its_final_answer():
    block = format_trajectory(long_reasoning_row(), index=1, max_chars=2000)
    assert len(block) <= 2000
    assert "FINAL ANSWER: <answer>B</answer>" in block
    assert "Which option? (A) x (B) y (C) z" in block  # short fields are left alone
    assert len(MARKER.findall(block)) == 1


def test_multi_turn_items_keep_tool_tails_first_and_last_turns_and_count_the_events_left_out():
    block = format_trajectory(multi_turn_row(), index=1, max_chars=6000)
    assert len(block) <= 6000
    assert "Find the file and report its size." in block and "<answer>12</answer>" in block
    tails = re.findall(r"TAIL(\d+): 12 bytes", block)
    assert "59" in tails and "0" in tails
    assert re.search(r"^- \[… \d+ events elided …\]$", block, re.M)
    assert block.endswith("verdict: wrong")


def test_elide_middle_keeps_more_of_the_end_than_the_start():
    text = "".join(chr(ord("a") + k % 26) for k in range(1000))
    short = elide_middle(text, 200)
    assert len(short) <= 200
    head, tail = MARKER.split(short)[0], MARKER.split(short)[-1]
    assert text.startswith(head) and text.endswith(tail) and len(tail) > len(head)
    assert int(MARKER.search(short).group(1)) == 1000 - len(head) - len(tail)


def test_trajectories_share_a_budget_short_ones_stay_whole():
    short = row("s", [{"type": "message", "role": "user", "content": "2+2? (A) 3 (B) 4"},
                      {"type": "message", "role": "assistant", "content": "<answer>A</answer>"}])
    rows = [short, long_question_row("q1"), long_reasoning_row("r1")]
    blocks = fit_trajectories(rows, budget_chars=8000)
    assert sum(len(b) for b in blocks) + 4 <= 8000
    assert blocks[0] == format_trajectory(short, index=1)
    assert all(MARKER.search(b) for b in blocks[1:])
    assert "(C) 1932" in blocks[1] and "FINAL ANSWER: <answer>B</answer>" in blocks[2]


def test_when_even_the_headers_pass_the_budget_the_last_trajectories_are_left_out_and_said_so():
    rows = [long_question_row(f"q{k}") for k in range(8)]
    floor = [len(format_trajectory(r, index=i + 1, max_chars=0)) for i, r in enumerate(rows)]
    note = "(5 more trajectories left out: the prompt has no room for them in the context window)"
    # room for three cut blocks, the note and the blank lines between them, not for a fourth block
    budget = sum(floor[:3]) + 2 * 3 + len(note) + floor[3] // 2
    blocks = fit_trajectories(rows, budget_chars=budget, drop_to_fit=True)
    assert len(blocks) == 4 and blocks[-1].startswith("(5 more trajectories left out")
    assert sum(len(b) for b in blocks) + 2 * (len(blocks) - 1) <= budget
    assert [b.splitlines()[0] for b in blocks[:3]] == [
        format_trajectory(r, index=i + 1).splitlines()[0] for i, r in enumerate(rows[:3])]
    # without drop_to_fit (the slow update pairs blocks with its rows) every row keeps its block
    assert len(fit_trajectories(rows, budget_chars=budget)) == 8
    # one block is always kept, however small the budget
    assert len(fit_trajectories(rows, budget_chars=10, drop_to_fit=True)) == 2


def test_an_analyst_prompt_fits_its_size_and_shows_every_trajectory_end():
    rows = [long_question_row(f"q{k}") for k in range(8)]
    request = analyst_request(kind="failure", skill="# Skill", budget=3, rows=rows, prompt_chars=20_000)
    assert request.prompt_chars() <= 20_000
    text = request.last_user_text()
    assert text.count("(A) 1901 (B) 1921 (C) 1932") == 8 and text.count("expected: C") == 8
    whole = analyst_request(kind="failure", skill="# Skill", budget=3, rows=rows)
    assert whole.prompt_chars() > 8 * 17_000 and not MARKER.search(whole.last_user_text())


def test_the_slow_update_prompt_fits_its_size_and_shows_both_answers_of_each_pair():
    before = [long_question_row(f"q{k}") for k in range(4)]
    after = [row.model_copy(update={"hard": 1.0, "soft": 1.0, "fail_reason": "", "predicted_answer": "C"})
             for row in before]
    request = slow_update_request(start_skill="# Old", current_skill="# New", previous_guidance="",
                                  pairs=pair_by_id(before, after), prompt_chars=15_000)
    assert request.prompt_chars() <= 15_000
    text = request.last_user_text()
    assert text.count("Previous skill's run (outcome: failed (hard 0.00, soft 0.00), answer `B`") == 4
    assert text.count("New skill's run (outcome: solved (hard 1.00, soft 1.00), answer `C`)") == 4
    assert text.count("(C) 1932") == 4
