"""Hardware detection and the offload planner."""
