"""`python -m app.engine.llamacpp.peer_server ARGS`: llama-cpp-python's own OpenAI server
(`python -m llama_cpp.server ARGS`) loading with this machine's safe CPU buffer types.

The serve benchmark's anchor and the remote-engine tests run this peer beside Stoke; with
llama.cpp's raw defaults it would crash on the AMX machines Stoke itself protects against
(cpu_buffers.py), and a comparison needs both sides to run. Its threads wait at barriers as
the engine's do (openmp.py), so a comparison measures the servers, not libgomp's spinning.
"""

from __future__ import annotations

from app.engine.llamacpp.openmp import spin_briefly


def main() -> None:
    spin_briefly()  # its threads wait as the engine's do, set before llama.cpp loads
    from llama_cpp.server.__main__ import main as serve

    from app.engine.llamacpp.cpu_buffers import safe_defaults

    with safe_defaults():
        serve()


if __name__ == "__main__":
    main()
