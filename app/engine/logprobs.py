"""Log-probabilities of a drawn token and of the likeliest alternatives, from the logits it
was drawn from (after any grammar mask, before temperature and truncation), as OpenAI's
`logprobs` / `top_logprobs` report them. Both runtimes hand their logits here as numpy."""

from __future__ import annotations

import numpy as np

Scores = tuple[float | None, tuple[tuple[int, float], ...]]  # (drawn token's, top (id, lp))
NO_SCORES: Scores = (None, ())


def scores(logits: np.ndarray, token: int, n_top: int) -> Scores:
    values = logits.astype(np.float64, copy=False)
    finite = np.isfinite(values)
    peak = values[finite].max() if finite.any() else 0.0
    log_total = peak + np.log(np.exp(values[finite] - peak).sum())
    chosen = float(values[token] - log_total) if finite[token] else float("-inf")
    if n_top <= 0:
        return chosen, ()
    n = min(n_top, int(finite.sum()))
    top = np.argpartition(-np.where(finite, values, -np.inf), n - 1)[:n] if n else []
    ranked = sorted(((int(i), float(values[i] - log_total)) for i in top), key=lambda p: -p[1])
    return chosen, tuple(ranked)
