"""The machine: detection (GPUs, unified memory, RAM, other machines' llama.cpp rpc-servers),
the KV and compute memory model, the offload planner (across machines too, with the network's
cost), and the synthetic DeepSeek V4 Flash GGUFs it is tested against.

May import: engine (GGUF reading, llama.cpp's devices and overrides), paths. Never models,
settings, session, server or the UI.
"""
