"""Which drafted tokens a reply keeps: the target's distribution at each verified position
and the speculative sampling rule over it, on numpy logits from either runtime.

At temperature 0 a draft token is kept when it is the target's argmax, so the reply is the
one plain decoding gives. With sampling, draft token x (drafted with probability q(x)) is
kept with probability min(1, p(x) / q(x)), and at the first refusal the token is drawn from
normalize(max(0, p - q)) instead (Leviathan et al., 2023): every kept token then follows p,
whatever the drafter proposed. Drafters here are deterministic (prompt lookup, a greedy
draft model), so q is a point mass: x is kept with probability p(x), else the token comes
from p with x left out.

`target_probs` is the sampler chain as llama.cpp orders it (logit bias, then top-k, top-p
and min-p on the untempered distribution, then temperature), the same semantics both
runtimes' own samplers give `SamplingParams`.
"""

from __future__ import annotations

import numpy as np

from app.engine.protocol import SamplingParams


def biased(logits: np.ndarray, sampling: SamplingParams) -> np.ndarray:
    """The logits with the request's logit bias added (a copy only when there is one)."""
    if not sampling.logit_bias:
        return logits
    out = np.array(logits, dtype=np.float32)
    for token, bias in sampling.logit_bias:
        if 0 <= token < out.size:
            out[token] += bias
    return out


def greedy_token(logits: np.ndarray, sampling: SamplingParams) -> int:
    return int(np.argmax(biased(logits, sampling)))


def target_probs(logits: np.ndarray, sampling: SamplingParams) -> np.ndarray:
    """The distribution a token is drawn from after `logits`, at temperature > 0."""
    z = biased(logits, sampling).astype(np.float64)
    z = np.where(np.isfinite(z), z, -np.inf)
    p1 = np.exp(z - z.max())
    if 0 < sampling.top_k < z.size:
        pool = np.argpartition(-z, sampling.top_k - 1)[: sampling.top_k]
    else:
        pool = np.flatnonzero(p1 > 0)
    total = p1[pool].sum()  # top-p's cumulative runs over what top-k kept, renormalised
    if sampling.min_p > 0:  # a prefix of the sorted order, as top-p's set is: intersect
        pool = pool[p1[pool] >= sampling.min_p * p1[pool].max()]
    pool = pool[np.argsort(-p1[pool], kind="stable")]
    if sampling.top_p < 1.0:
        reached = np.cumsum(p1[pool]) / total >= sampling.top_p
        if reached.any():
            pool = pool[: int(np.argmax(reached)) + 1]
    out = np.zeros(z.size)
    tempered = z[pool] / sampling.temperature
    weights = np.exp(tempered - tempered.max())
    out[pool] = weights / weights.sum()
    return out


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One token from the distribution `p` (not necessarily normalised)."""
    cumulative = np.cumsum(p)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, p.size - 1)


def accept(
    p: np.ndarray, x: int, rng: np.random.Generator, q: np.ndarray | None = None
) -> int | None:
    """Speculative sampling of draft token `x` against the target's `p`: None when `x` is
    kept, else the token drawn in its place. `q` is the drafter's distribution (None: it
    proposed `x` for certain)."""
    qx = 1.0 if q is None else float(q[x])
    if qx > 0 and rng.random() * qx < p[x]:
        return None
    if q is None:
        residual = p.copy()
        residual[x] = 0.0
    else:
        residual = np.maximum(p - q, 0.0)
    if residual.sum() <= 0:  # p equals q: a refusal cannot happen, keep the arithmetic safe
        residual = p
    return draw(residual, rng)
