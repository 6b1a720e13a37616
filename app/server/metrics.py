"""Prometheus' text format for the server's counters (`GET /metrics`, as llama-server has):
requests, tokens prefilled and reused, TTFT and decode-rate histograms, the loaded model.

A histogram keeps cumulative bucket counts, a sum and a count, so memory stays the same
however many replies are observed.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DECODE_BUCKETS = (1.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)  # tokens a second


class Histogram:
    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, help_text: str) -> list[str]:
        out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        out += [f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]
        return out


def counter(name: str, help_text: str, value: float, kind: str = "counter") -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value:g}"]


def text(blocks: Iterable[list[str]]) -> str:
    return "\n".join(line for block in blocks for line in block) + "\n"
