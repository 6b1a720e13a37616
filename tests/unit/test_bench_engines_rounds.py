"""How `stoke bench engines` takes its rounds: both sides held and interleaved, or with
--one-at-a-time each side loaded, run at every length and unloaded before the other loads
(a model too large to be held twice)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from app.bench.engines import Opener, Side, _compare


def _recording(name: str, events: list[str], rate: float) -> Opener:
    @contextmanager
    def opened() -> Iterator[Side]:
        events.append(f"open {name}")

        def run(length: int, n: int) -> tuple[float, float]:
            events.append(f"{name} {length}")
            return rate * length, rate

        yield run
        events.append(f"close {name}")

    return opened


def _args(one_at_a_time: bool) -> argparse.Namespace:
    return argparse.Namespace(rounds=2, decode=4, one_at_a_time=one_at_a_time)


def test_one_at_a_time_unloads_each_side_before_the_other_loads() -> None:
    events: list[str] = []
    ours, theirs = _recording("stoke", events, 2.0), _recording("runtime", events, 1.0)
    result = _compare(ours, theirs, [8, 16], _args(True))
    assert events == [
        "open stoke",
        *["stoke 8"] * 3,
        *["stoke 16"] * 3,
        "close stoke",
        "open runtime",
        *["runtime 8"] * 3,
        *["runtime 16"] * 3,
        "close runtime",
    ]
    assert result[16]["ratio"] == {"prefill_tok_s": 2.0, "decode_tok_s": 2.0}
    assert len(result[8]["runs"]["stoke"]) == 2  # the warm-up round is dropped


def test_by_default_both_sides_are_held_and_their_rounds_alternate() -> None:
    events: list[str] = []
    ours, theirs = _recording("stoke", events, 1.0), _recording("runtime", events, 4.0)
    result = _compare(ours, theirs, [8], _args(False))
    assert events == [
        "open stoke",
        "open runtime",
        *["stoke 8", "runtime 8"] * 3,
        "close runtime",
        "close stoke",
    ]
    assert result[8]["stoke"]["decode_tok_s"] == 1.0 and result[8]["ratio"]["decode_tok_s"] == 0.25
