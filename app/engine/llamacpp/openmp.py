"""How llama.cpp's CPU threads wait for each other, set before llama.cpp loads.

This llama.cpp runs a graph's CPU threads through OpenMP (libgomp), and they meet at a
barrier after every op. libgomp's default lets a waiting thread spin 300,000 times (some
milliseconds) before it sleeps, so when another process holds one of the cores, the thread
every barrier waits for is descheduled while its partner spins away the time it needed. On
two cores with one busy (SmolLM2 cut to 2 blocks, 2 threads pinned to 2 of an idle Xeon's
cores) decode fell from 446 to 3.7 tok/s and an 800-token prefill rose from 0.25 to 1.32 s;
sleeping at once (OMP_WAIT_POLICY=PASSIVE) kept 195 tok/s and 0.45 s under that load but
cost 17% of the quiet decode; spinning 1,000 times first kept 250 tok/s and 0.32 s under
load and the quiet speed within 6% of 10,000 spins. On the shared 2-core box, where other
jobs keep about one core busy, the default made `stoke bench serve`'s first turns 3-5x slower.

libgomp reads its environment once, when it loads, so `spin_briefly` is called first thing in
the processes that run llama.cpp's graphs (the engine process, the llama_cpp.server peer).
"""

from __future__ import annotations

import os

SPIN_COUNT = 1000  # busy-wait iterations at a barrier before the thread sleeps


def spin_briefly() -> None:
    """Have llama.cpp's threads sleep soon at a barrier, unless the user chose how they wait."""
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
