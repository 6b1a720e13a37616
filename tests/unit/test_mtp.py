"""The MTP drafter's bookkeeping over a stand-in head: which target state feeds which entry
(entry p reads the state of p - 1), where entries start (within the head's window), what is
reused across proposals and what is cut (its own guesses, a diverged branch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from app.engine.mtp import HiddenRows, MtpDrafter

VOCAB = 64


@dataclass
class Head:
    """Guesses token + 1; its state names the position it was made at."""

    window: int = 4
    steps: list[tuple[int, list[int], list[object]]] = field(default_factory=list)
    cuts: list[int] = field(default_factory=list)

    def step(self, key, start, tokens, states):
        self.steps.append((start, list(tokens), list(states)))
        logits = np.zeros(VOCAB, np.float32)
        logits[(tokens[-1] + 1) % VOCAB] = 1
        return logits, ("mtp", start + len(tokens) - 1)

    def cut(self, key, keep):
        self.cuts.append(keep)

    def close(self):
        pass


def _engine(n: int, hidden_to: int | None = None):
    hidden = HiddenRows(16)
    end = n if hidden_to is None else hidden_to
    hidden.record(0, [("h", p) for p in range(end)], end)
    slot = SimpleNamespace(tokens=list(range(n)), hidden=hidden)
    logits = np.zeros(VOCAB, np.float32)
    logits[n % VOCAB] = 1
    return SimpleNamespace(
        _slots={"a": slot}, _n_ctx=1000, _eog=frozenset({63}), _logits=lambda held: logits
    )


def test_hidden_rows_replace_from_a_position_and_forget_a_gap() -> None:
    rows = HiddenRows(4)
    rows.record(0, list("abcdef"), 6)
    assert (rows.first, rows.end) == (2, 6)
    rows.record(4, list("XY"), 2)
    assert rows.get(2, 6) == list("cdXY")
    rows.cut(5)
    assert rows.get(2, 5) == list("cdX") and rows.get(2, 6) is None
    rows.record(9, list("z"), 1)  # a gap: nothing before it is trusted
    assert (rows.first, rows.end) == (9, 10)


def test_entries_read_the_state_before_them_and_guesses_are_cut() -> None:
    head = Head()
    engine = _engine(10)
    drafter = MtpDrafter(engine, head, 2)
    assert engine._keep_hidden > head.window
    drafts = drafter.propose("a", [*range(10), 10], 3)  # token 10 handed out, not evaluated
    assert drafts == [11, 12, 13]
    start, tokens, states = head.steps[0]
    assert start == 6  # the window of position 10
    assert tokens == [6, 7, 8, 9, 10]
    assert states == [("h", p) for p in range(5, 10)]
    assert head.steps[1] == (11, [11], [("mtp", 10)])
    assert head.steps[2] == (12, [12], [("mtp", 11)])
    assert head.cuts[-1] == 11  # the guesses' entries go; 10 was the reply's own token

    # two drafts kept: the target evaluated 10, 11, 12 and hands out 13
    engine._slots["a"].tokens = list(range(13))
    engine._slots["a"].hidden.record(10, [("h", p) for p in range(10, 13)], 3)
    head.steps.clear()
    assert drafter.propose("a", list(range(14)), 1) == [14]
    assert head.steps == [(11, [11, 12, 13], [("h", 10), ("h", 11), ("h", 12)])]


def test_with_no_token_drawn_yet_the_last_entry_guesses_it_and_is_read_again() -> None:
    head = Head()
    drafter = MtpDrafter(_engine(10), head, 2)
    assert drafter.propose("a", list(range(10)), 3) == [10, 11, 12]
    assert head.steps[0] == (5, [5, 6, 7, 8, 9], [("h", p) for p in range(4, 9)])
    assert head.steps[1][0] == 10
    assert head.cuts[-1] == 10
    head.steps.clear()
    assert drafter.propose("a", list(range(10)), 1) == [10]  # the same history again
    assert head.steps == [(9, [9], [("h", 8)])]
    assert 9 in head.cuts


def test_a_diverged_branch_cuts_the_entries_and_missing_states_draft_nothing() -> None:
    head = Head()
    engine = _engine(10)
    drafter = MtpDrafter(engine, head, 2)
    drafter.propose("a", [*range(10), 10], 1)
    engine._slots["a"].tokens = [0, 1, 2, 3, 4, 5, 6, 40, 41, 42]
    engine._slots["a"].hidden.record(7, [("g", p) for p in range(7, 10)], 3)
    head.steps.clear()
    drafter.propose("a", [*engine._slots["a"].tokens, 43], 1)
    assert 7 in head.cuts  # entries from the first differing token on
    assert head.steps[0] == (7, [40, 41, 42, 43], [("h", 6), ("g", 7), ("g", 8), ("g", 9)])

    short = MtpDrafter(_engine(10, hidden_to=8), Head(), 2)  # no state for position 9
    assert short.propose("a", [*range(10), 10], 2) == []
