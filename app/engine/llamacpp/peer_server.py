"""`python -m app.engine.llamacpp.peer_server ARGS`: llama-cpp-python's own OpenAI server
(`python -m llama_cpp.server ARGS`) loading with this machine's safe CPU buffer types.

The serve benchmark's anchor and the remote-engine tests run this peer beside Stoke; with
llama.cpp's raw defaults it would crash on the AMX machines Stoke itself protects against
(cpu_buffers.py), and a comparison needs both sides to run.
"""

from __future__ import annotations

from app.engine.llamacpp.cpu_buffers import safe_defaults


def main() -> None:
    from llama_cpp.server.__main__ import main as serve

    with safe_defaults():
        serve()


if __name__ == "__main__":
    main()
