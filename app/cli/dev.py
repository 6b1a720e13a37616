"""`stoke dev`: developer tools: synthetic DeepSeek V4 Flash GGUFs, the Flash layout the
catalog ships (regenerate it when `app/hardware/synthetic_gguf.py` changes), a draft model cut
from a GGUF's first blocks (for speculative decoding's bench), and the walk that photographs
the window for the README and docs/."""

from __future__ import annotations

import argparse
from pathlib import Path

from app import resources
from app.bench import walk
from app.hardware.synthetic_gguf import flash_layout_text, write_deepseek4
from app.models.catalog import FLASH_LAYOUT
from app.models.default import default_model_path
from app.models.truncated_gguf import write_truncated

SHIPPED_LAYOUT = resources.CHECKOUT / FLASH_LAYOUT


def _make_gguf(args: argparse.Namespace) -> int:
    path = write_deepseek4(
        args.out, mode=args.mode, seed=args.seed, weights=args.weights, mtp=args.mtp
    )
    stat = path.stat()
    print(
        f"wrote {path} ({args.mode}): apparent size {stat.st_size / 2**20:,.1f} MiB, "
        f"on disk {stat.st_blocks * 512 / 2**20:,.1f} MiB"
    )
    return 0


def _make_draft(args: argparse.Namespace) -> int:
    source = args.source or default_model_path()
    try:
        path = write_truncated(source, args.out, args.layers)
    except ValueError as exc:
        print(f"stoke dev make-draft: {exc}")
        return 1
    print(f"wrote {path}: the first {args.layers} blocks of {source.name}")
    return 0


def _flash_layout(args: argparse.Namespace) -> int:
    args.out.write_text(flash_layout_text(), "utf-8")
    print(f"wrote {args.out}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    dev = subparsers.add_parser("dev", help="developer tools")
    tools = dev.add_subparsers(dest="tool", metavar="TOOL", required=True)
    parser = tools.add_parser(
        "make-gguf", help="write a synthetic DeepSeek V4 Flash GGUF (full sparse or scaled)"
    )
    parser.add_argument("--mode", choices=("full", "scaled"), required=True)
    parser.add_argument("--seed", type=int, default=0, help="random weights of the scaled model")
    parser.add_argument(
        "--weights",
        choices=("quantized", "f16", "f32"),
        default="quantized",
        help="scaled mode: Q8_0 matrices, or every matrix in F16 or F32",
    )
    parser.add_argument("--mtp", action="store_true", help="append the MTP (NextN) block")
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    parser.set_defaults(run=_make_gguf)
    draft = tools.add_parser(
        "make-draft", help="write a draft model: the first blocks of a GGUF (default model's)"
    )
    draft.add_argument("--layers", type=int, default=2, help="blocks to keep (default 2)")
    # the default model is looked up when the tool runs: its package imports the `llm` CLI and
    # llama.cpp, half a second of every `stoke` start when it was the parser's default
    draft.add_argument("--source", type=Path, help="the target (default: the default model)")
    draft.add_argument("out", type=Path, help="the .gguf file to write")
    draft.set_defaults(run=_make_draft)
    layout = tools.add_parser(
        "flash-layout", help="write the DeepSeek V4 Flash layout the catalog plans with"
    )
    layout.add_argument(
        "--out", type=Path, default=SHIPPED_LAYOUT, help=f"where (default: {SHIPPED_LAYOUT})"
    )
    layout.set_defaults(run=_flash_layout)
    walk_parser = tools.add_parser(
        "walk", help="photograph the window's scenes under Xvfb + openbox (for docs/*.png)"
    )
    walk.add_arguments(walk_parser)
    walk_parser.set_defaults(run=walk.run)
