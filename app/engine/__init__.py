"""The engines: the protocol (plain picklable types), the host process and its asyncio
client, token-exact transcripts, KV snapshots, prewarming, the llama.cpp, MLX and remote
backends, and GGUF reading (`model_file`, `gguf_info`).

May import: only paths, stored (its caches' schemas) and resources (ground). Never models,
hardware, settings, session, server or the UI: they all import this room.
"""
