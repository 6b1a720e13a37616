"""`stoke bench`: the benchmarks of app/bench/ that run from the command line."""

from __future__ import annotations

import argparse

from app.bench import (
    attach,
    cpu_buffers,
    decode,
    deepseek_v4_reference,
    engines,
    kv,
    prefill,
    serve,
    tools,
    ui_stall,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks (see app/bench/)")
    benchmarks = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for bench in (
        kv,
        ui_stall,
        attach,
        serve,
        tools,
        cpu_buffers,
        decode,
        prefill,
        deepseek_v4_reference,
        engines,
    ):
        bench.add_parser(benchmarks)
