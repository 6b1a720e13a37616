"""The frozen executable's entry point: `stoke` as the console script, and the interpreter.

Stoke starts parts of itself as child processes with `sys.executable -m MODULE ...` (the
engine process, the llama.cpp probes, the hardware detection) and `sys.executable -c CODE`
(`stoke doctor`'s loads, the Qt check). In a frozen app `sys.executable` is this program and
there is no Python beside it, so it answers those two forms itself, as `python` would: the
module or code runs in this process as `__main__` with the rest of the command line as
`sys.argv[1:]`. Anything else is the `stoke` command line. `stoke` has no top-level `-m` or
`-c` option, so the two cannot be confused.
"""

from __future__ import annotations

import runpy
import sys

# Development tools some benchmarks drive (`stoke bench serve` speaks through the openai
# client): left out of the bundle, and a command that needs one says so instead of failing.
DEV_ONLY = ("openai", "anthropic", "agents", "pytest", "_pytest", "pytestqt", "jsonschema")


def run(argv: list[str]) -> int:
    """Dispatch `argv` (without the program name) and return the exit status."""
    if len(argv) >= 2 and argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    if len(argv) >= 2 and argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        return 0
    from app.__main__ import main

    try:
        return main(argv)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in DEV_ONLY:
            raise
        print(
            f"stoke: this command needs the Python package '{exc.name}', a development tool "
            "the installed app does not include; run it from a source checkout "
            "(`make run ARGS=...`).",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
