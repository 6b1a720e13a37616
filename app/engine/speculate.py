"""Speculative decoding over a runtime's hooks, for the one generate loop in `slots.py`.

`Decoder` is that loop's token source. A plain step draws one token with the runtime's own
sampler (`Draw`). A speculative step asks a drafter (`drafting.py`, `draft_model.py`) for k
tokens, evaluates the pending token and the drafts in one batch (`SlotEngine._verify`: the
logits of every position), keeps the longest prefix the target agrees with (`acceptance.py`)
and then the target's own token at the first disagreement, and trims the refused drafts from
the KV, so the slot holds exactly the tokens handed out and the next turn's prefix matches.

At temperature 0 the reply is plain decoding's token for token, with one care: a runtime's
batched kernels round differently from its one-token ones (llama.cpp's verify logits differ
from its decode logits by up to 0.8 on the default model), so a verify row whose top two
logits are within TIE_MARGIN of each other decides nothing; its token is decoded alone next.

When it pays is measured, not assumed (`Pace`): the seconds of a forward of n tokens, kept
for the engine's life, and per drafter the drafting seconds and the rate at which its tokens
are kept, decayed as the reply goes, kept apart for each kind of bet it makes (a prompt
lookup's long matches from its short ones: `Drafter.band`). Each step takes the draft length
with the most expected tokens per second, and decodes plainly when none beats one token per
plain forward.
A free drafter (prompt lookup) is still scored while it is off, so it comes back when the
reply starts repeating; a costly one is retried after a back-off that doubles each time.
Expectations can be wrong (a first guess right, the rest of the draft not; a verify wasted on
a near tie), so a `Budget` bounds what they may cost: a verify runs only when its worst case
still leaves the reply within LOSS_BUDGET of plain decoding's time, counting what earlier
verifies saved or lost.

Speculation stays off where the verify batch cannot give what sampling needs: a grammar (the
constraint's state advances token by token), repetition penalties (they depend on every
token before), logprobs, and runtimes whose KV cannot be cut at any position.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.engine.acceptance import accept, biased, draw, greedy_token, target_probs
from app.engine.drafting import Drafter
from app.engine.images import text_only
from app.engine.logprobs import NO_SCORES, Scores
from app.engine.protocol import ContextOverflowError, SamplingParams
from app.engine.runtime import Draw, Slot, SlotRuntime

MAX_DRAFT = {"lookup": 24, "draft": 8}
DECAY = 0.9  # per verify: how fast old acceptance evidence fades
PRIOR_KEPT, PRIOR_SEEN = 1.0, 2.0  # a drafter starts believed right half the time
BACKOFF_START, BACKOFF_MAX = 8, 256  # plain tokens before a costly drafter is tried again
MARGIN = 1.03  # expected gain a verify must promise over plain decoding
TIE_MARGIN = 2.0  # logits: a verify row's top two closer than this are re-decoded alone
LOSS_BUDGET = 0.04  # of plain decoding's time for the tokens so far: what speculation may lose


def speculates(sampling: SamplingParams) -> bool:
    """Whether the verify batch gives all this sampling needs (see the module docstring)."""
    return sampling.grammar is None and not sampling.penalized and sampling.logprobs is None


class Pace:
    """The seconds of one forward of n tokens (a plain decode is n = 1), measured as the
    engine decodes; lasts as long as the loaded model."""

    def __init__(self) -> None:
        self._seconds: dict[int, float] = {}

    def observe(self, n: int, seconds: float) -> None:
        old = self._seconds.get(n)
        self._seconds[n] = seconds if old is None else 0.8 * old + 0.2 * seconds

    def seconds(self, n: int) -> float | None:
        """Measured, else read off the nearest measured sizes (None: no plain decode yet)."""
        if n in self._seconds:
            return self._seconds[n]
        one = self._seconds.get(1)
        if one is None:
            return None
        below = max((m for m in self._seconds if m < n), default=1)
        above = min((m for m in self._seconds if m > n), default=None)
        if above is not None:
            low, high = self._seconds[below], self._seconds[above]
            return low + (high - low) * (n - below) / (above - below)
        slope = (self._seconds[below] - one) / (below - 1) if below > 1 else 0.05 * one
        return self._seconds[below] + max(slope, 0.0) * (n - below)


@dataclass
class Budget:
    """Item 5's promise kept by accounting rather than by expectation: the seconds this
    reply's verifies saved against plain decoding (negative: lost) and the tokens it has
    handed out. A verify runs only when, even if it hands out nothing but what a plain step
    would, the loss stays within one plain forward plus LOSS_BUDGET of what plain decoding
    spent on the reply so far; so however its drafts fare a reply is at most that much
    slower than plain decoding, and the verifies that pay earn the room for more. (Costs are
    the `Pace`'s: a batch size never run before is estimated, and measured once it has.)"""

    saved: float = 0.0
    handed: int = 0

    def affordable(self, k: int, pace: Pace, draft_s: float, exact: bool) -> int:
        """The longest draft up to `k` whose worst case fits (0: decode plainly). The worst
        case hands out the target's own token alone, or, where verify rows are not trusted
        whole (`Decoder._trusted`), nothing: its first row was a near tie."""
        one = pace.seconds(1)
        if one is None:
            return 0
        room = self.saved + (1 + int(exact) + LOSS_BUDGET * self.handed) * one
        while k > 0 and (pace.seconds(k + 1) or 0.0) + draft_s * k > room:
            k -= 1
        return k

    def settle(self, produced: int, seconds: float, pace: Pace) -> None:
        """A verify that took `seconds` and handed out `produced` tokens, each of which a plain
        step would have taken one forward for."""
        self.saved += produced * (pace.seconds(1) or 0.0) - seconds


@dataclass
class _Odds:
    """One drafter's record in this reply: how often its tokens are kept, what it costs."""

    drafter: Drafter
    kept: float = PRIOR_KEPT
    seen: float = PRIOR_SEEN
    draft_s: float = 0.0  # seconds per drafted token (0 for a free drafter)
    wait: int = 0  # plain steps before a costly drafter is tried again
    backoff: int = BACKOFF_START

    def observe(self, kept: int, refused: bool) -> None:
        self.kept = DECAY * self.kept + kept
        self.seen = DECAY * self.seen + kept + int(refused)

    def length(self, pace: Pace, room: int) -> int:
        """The draft length with the most expected tokens per second, 0 when plain wins."""
        one = pace.seconds(1)
        if one is None or room < 2:
            return 0
        rate = min(self.kept / self.seen, 0.99)
        best, best_rate = 0, MARGIN / one
        for k in range(1, min(MAX_DRAFT.get(self.drafter.name, 8), room - 1) + 1):
            expected = (1 - rate ** (k + 1)) / (1 - rate)  # kept drafts + the target's own
            cost = pace.seconds(k + 1) + self.draft_s * k
            if expected / cost > best_rate:
                best, best_rate = k, expected / cost
        return best


@dataclass
class Counts:
    """What the reply's stats report: drafted tokens verified, and those kept."""

    drafted: int = 0
    accepted: int = 0


@dataclass
class Decoder:
    """The reply's token source (see the module docstring). `_pending` is a token handed out
    but not yet in the slot's KV: the next step evaluates it, alone or before the drafts."""

    engine: SlotRuntime[Any]
    draw: Draw[Any]
    sampling: SamplingParams
    name: str  # the slot's
    drafters: Sequence[Drafter] = ()
    pace: Pace = field(default_factory=Pace)
    counts: Counts = field(default_factory=Counts)
    budget: Budget = field(default_factory=Budget)

    def __post_init__(self) -> None:
        self._pending: int | None = None
        self._drafters = list(self.drafters) if speculates(self.sampling) else []
        self._odds: dict[tuple[int, int], _Odds] = {}  # per (drafter, band)
        seed = self.sampling.seed
        # Its own stream: never the runtime sampler's numbers again (a shared seed would tie
        # the acceptance draws to the plain draws and bias both).
        self._rng = np.random.default_rng(None if seed is None else [seed & 0xFFFFFFFF, 0x5EED])
        self._scores: Scores = NO_SCORES

    def scores(self) -> Scores:
        return self._scores

    def next(self, slot: Slot, room: int) -> tuple[list[int], bool]:
        """The reply's next tokens (at most `room`, none when the context is full) and whether
        an end-of-turn token came after them (not handed out; nothing of it stays in the KV)."""
        history = slot.tokens if self._pending is None else [*slot.tokens, self._pending]
        room = min(room, self.engine._n_ctx - len(history))
        if room <= 0:
            return [], False
        tokens, ended = self._step(slot, history, room)
        self.budget.handed += len(tokens)
        return tokens, ended

    def _step(self, slot: Slot, history: list[int], room: int) -> tuple[list[int], bool]:
        guesses: list[tuple[_Odds, int]] = []  # drafts scored against the plain token
        exact = self._exact()
        for index, drafter in enumerate(self._drafters):
            if drafter.free:  # proposing costs nothing: its band picks the odds to go by
                limit = MAX_DRAFT.get(drafter.name, 8)
                drafts = text_only(drafter.propose(self.name, history, limit))
                odds = self._record(index, drafter.band())
                k = min(odds.length(self.pace, room), len(drafts))
                k = self.budget.affordable(k, self.pace, 0.0, exact)
            else:
                odds = self._record(index, 0)
                k = self.budget.affordable(
                    odds.length(self.pace, room), self.pace, odds.draft_s, exact
                )
                if k == 0:
                    if odds.wait > 0:
                        odds.wait -= 1
                        continue
                    odds.wait, odds.backoff = odds.backoff, min(odds.backoff * 2, BACKOFF_MAX)
                drafts = self._propose(odds, history, max(k, 1))
            if drafts and k > 0:
                try:
                    out, ended = self._speculate(slot, odds, drafts[:k])
                except ContextOverflowError:  # no cells for the batch: decode plainly
                    self._drafters = []
                    break
                if out or ended:  # else its first row was a near tie: decode it alone
                    return out, ended
                break
            if drafts:
                guesses.append((odds, drafts[0]))
        tokens, ended = self._plain(slot, room)
        for odds, guess in guesses:
            right = tokens[:1] == [guess]
            odds.observe(int(right), not right)
        return tokens, ended

    def _record(self, index: int, band: int) -> _Odds:
        """The odds of the drafter at `index` for proposals of `band` (`Drafter.band`)."""
        key = (index, band)
        if key not in self._odds:
            self._odds[key] = _Odds(self._drafters[index])
        return self._odds[key]

    def _propose(self, odds: _Odds, history: Sequence[int], k: int) -> list[int]:
        started = time.perf_counter()
        drafts = odds.drafter.propose(self.name, history, k)
        if drafts and not odds.drafter.free:
            spent = (time.perf_counter() - started) / len(drafts)
            odds.draft_s = spent if not odds.draft_s else 0.7 * odds.draft_s + 0.3 * spent
        return drafts

    def _plain(self, slot: Slot, room: int) -> tuple[list[int], bool]:
        started = time.perf_counter()
        forwarded = self._pending is not None
        if forwarded:
            self.engine._forward(slot, [self._pending], want_logits=True)
            self._pending = None
        held = len(slot.tokens)
        token = self.draw.next(slot, room <= 1)
        fed = len(slot.tokens) > held  # evaluated ahead (MLX): the wait was for a forward
        if forwarded or fed:
            self.pace.observe(1, time.perf_counter() - started)
        self._scores = self.draw.scores()
        if token in self.engine._eog:
            if fed:
                self.draw.take_back(slot)
            return [], True
        self._pending = None if fed else token
        return [token], False

    def _speculate(self, slot: Slot, odds: _Odds, drafts: list[int]) -> tuple[list[int], bool]:
        """One verify: the tokens handed out (the last one left pending) and whether an
        end-of-turn token came after them."""
        started = time.perf_counter()
        eog = self.engine._eog
        ends = [i for i, t in enumerate(drafts) if t in eog]
        drafts = drafts[: ends[0] + 1] if ends else drafts  # nothing after an end is kept
        out: list[int] = []
        if self._pending is None:  # the logits after the slot are ready: judge the first draft
            token = self._judge(self.engine._logits(slot), drafts[0])
            self.counts.drafted += 1
            if token != drafts[0]:
                odds.observe(0, True)
                return self._hand_out(slot, [token], 0)
            self.counts.accepted += 1
            out, drafts = [token], drafts[1:]
            if not drafts:
                odds.observe(1, False)
                return self._hand_out(slot, out, 0)
            self._pending = token
        batch = [self._pending, *drafts]
        rows = self.engine._verify(slot, batch)
        kept, token = 0, None
        for i, row in enumerate(rows):
            if not self._trusted(row):
                break  # left to a single decode of batch[i], as plain decoding has it
            token = self._judge(row, drafts[i] if i < len(drafts) else None)
            if i == len(drafts) or token != drafts[i]:
                break
            kept, token = kept + 1, None
        spent = time.perf_counter() - started
        self.pace.observe(len(batch), spent)
        spent += odds.draft_s * len(drafts)  # the drafting, timed in `_propose`
        self.budget.settle(kept + (token is not None), spent, self.pace)
        self.counts.drafted += len(drafts)
        self.counts.accepted += kept
        odds.observe(kept + len(out), kept < len(drafts))
        odds.wait, odds.backoff = 0, BACKOFF_START
        handed = [*out, *drafts[:kept], *([token] if token is not None else [])]
        held = kept + (token is not None)  # of the batch, what the KV keeps
        if not handed:  # the first row was a near tie: its token stays pending
            self.engine._clear(slot, len(slot.tokens) - len(batch))
            return [], False
        return self._hand_out(slot, handed, len(batch) - held)

    def _hand_out(self, slot: Slot, tokens: list[int], refused: int) -> tuple[list[int], bool]:
        """Hand out `tokens` (all but the last already evaluated, then `refused` drafts at the
        KV's end), cut at the first end-of-turn token: one cut of the KV for both, since a
        hybrid memory can be cut only once within its last forward (a second cut would start
        it over)."""
        ends = [i for i, t in enumerate(tokens) if t in self.engine._eog]
        if ends:  # the end token and what followed it leave the KV, as they were never drawn
            cut = refused + len(tokens) - 1 - ends[0]
            tokens, self._pending = tokens[: ends[0]], None
        else:
            cut, self._pending = refused, tokens[-1]
        if cut:
            self.engine._clear(slot, len(slot.tokens) - cut)
        return tokens, bool(ends)

    def _exact(self) -> bool:
        """Whether every verify row is trusted (see `_trusted`)."""
        return self.sampling.temperature > 0 or self.engine._verify_exact

    def _trusted(self, logits: np.ndarray) -> bool:
        """Whether a verify row's greedy verdict is the one plain decoding would reach: a
        runtime's batched kernels round differently from its one-token ones (llama.cpp's
        logits moved by up to 0.8 here), so a near tie is left to a one-token decode."""
        if self._exact():
            return True
        z = biased(logits, self.sampling)
        best = int(np.argmax(z))
        top = z[best]
        z[best] = -np.inf
        gap = top - z.max()
        z[best] = top
        return bool(gap >= TIE_MARGIN)

    def _judge(self, logits: np.ndarray, draft: int | None) -> int:
        """The target's token after `logits`: `draft` itself when the rule keeps it."""
        if self.sampling.temperature <= 0:
            return greedy_token(logits, self.sampling)
        p = target_probs(logits, self.sampling)
        if draft is None:
            return draw(p, self._rng)
        replaced = accept(p, draft, self._rng)
        return draft if replaced is None else replaced
