"""The pool of engines: which library models are loaded now, below the server and the window.

`stoke serve` answers requests that name any library model: the pool loads a named model just
in time within a memory budget (the planner's estimate of each model's weights, KV and compute
against what the machine has), unloads the least recently used one to make room (its engine
snapshots every resident conversation's KV on the way out, so coming back restores rather
than prefills), unloads models idle past a TTL, and never unloads a pinned one. The window
hands its own engine to the server as a pool of one (`EnginePool.of_engine`), so both agree on
what is loaded.

engines.py: the pool, its leases, eviction and TTL; need.py: a model's memory estimate and
the machine's default budget.

May import: launch, settings, models, hardware, engine, units.
Never the server or the UI (they import it).
"""
