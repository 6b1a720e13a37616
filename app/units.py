"""How Stoke writes byte counts, in one place: binary GiB for memory (what the planner,
`stoke plan`, `stoke doctor` and the wizard compare against a GPU's or RAM's size), decimal
units for files and downloads (what a download page prints). Ground level: imports nothing
of the app.
"""

from __future__ import annotations

import math

GIB = 1 << 30


def gib(n: float, digits: int | None = None, *, unit: bool = True, up: bool = False) -> str:
    """`n` bytes as GiB with thousands separators. `digits=None` reads at a glance (2
    decimals below 10 GiB, 1 above); `up` rounds up, so a 30 MiB shortfall is 0.1, not 0.0."""
    value = n / GIB
    if digits is None:
        digits = 2 if abs(value) < 10 else 1
    if up:
        value = math.ceil(value * 10**digits) / 10**digits
    return f"{value:,.{digits}f}" + (" GiB" if unit else "")


def decimal_bytes(n: int) -> str:
    """Sizes as download pages print them (kB, MB, GB, TB), for file and download messages."""
    for name, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {name}"
    return f"{n} bytes"
