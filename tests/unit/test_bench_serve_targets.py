"""`stoke bench serve`'s verdicts from its summaries: the interleaved follow-ups against the
single conversation, and turn 1 against the anchor rep by rep (the worst rep decides)."""

from __future__ import annotations

from app.bench.serve import summarise, targets


def _run(turn1: list[float], follow_up: float) -> dict[str, list]:
    return {"ttfts": [turn1, [follow_up] * len(turn1)], "ratios": [0.98]}


def test_turn_one_is_judged_rep_by_rep_on_each_reps_median() -> None:
    stoke = {"1": summarise([_run([3.0], 0.15), _run([3.3], 0.15)], 1)}
    stoke["2"] = summarise([_run([3.0, 3.4], 0.15), _run([3.1, 5.0], 0.16)], 2)
    anchor = {"1": summarise([_run([3.1], 0.13), _run([3.2], 0.13)], 1)}
    anchor["2"] = summarise([_run([3.2, 3.2], 0.6), _run([3.5, 3.5], 0.6)], 2)
    assert stoke["2"]["turn1_by_rep_s"] == [3.2, 4.05]

    verdict = targets({"stoke": stoke, "anchor": anchor})

    assert verdict["stoke_turn1_vs_anchor_by_rep"] == [0.97, 1.03, 1.0, 1.16]
    assert verdict["stoke_turn1_within_1.1x_every_rep"] is False
    assert verdict["stoke_2_interleaved_within_2x"] is True


def test_without_the_anchor_there_is_no_turn_one_verdict() -> None:
    stoke = {"1": summarise([_run([3.0], 0.15)], 1)}
    assert "stoke_turn1_within_1.1x_every_rep" not in targets({"stoke": stoke})
