"""mx.fast.metal_kernel on CPU threads: MLX's own kernel text, compiled against metal_on_cpu.h.

`EmulatedKernel` takes metal_kernel's arguments and, when called, asks MLX for the exact
kernel source it would hand the Metal compiler (MLX prints it with verbose=True; without a
Metal device it builds it only while exporting, so the call is traced into an export), then
compiles that text with the header and runs it with MLX's dispatch semantics
(dispatchThreads: the grid counts threads, the group is min(threadgroup, grid)). Binaries are
cached in the temp dir under the hash of their source, so each is compiled once.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np

HEADER = Path(__file__).with_name("metal_on_cpu.h")
CACHE = Path(tempfile.gettempdir()) / "stoke-metal-on-cpu"
FLAGS = ("-std=c++20", "-O1", "-pthread", "-w", "-fno-strict-aliasing")
MLX_METAL_KERNEL = mx.fast.metal_kernel
STUBS = ("metal_simdgroup", "metal_simdgroup_matrix", "metal_stdlib")  # the headers MSL includes

_PARAM = re.compile(
    r"^\s*(?:const )?(?P<space>constant|device) (?P<type>\w+)(?P<ref>[*&]) (?P<name>\w+)"
    r" \[\[buffer\((?P<index>\d+)\)\]\]$"
)
_ATTRIBUTE = re.compile(r"^\s*uint3? (?P<name>\w+) \[\[(?P=name)\]\]$")


class EmulationError(RuntimeError):
    """The emulated kernel did not compile or stopped (a divergent barrier, a bad launch)."""


def compiler() -> str | None:
    """A C++20 compiler with ucontext (the threads' fibers), or None."""
    found = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if found is None:
        return None
    probe = "#include <ucontext.h>\nint main() { ucontext_t c; return getcontext(&c); }\n"
    done = subprocess.run(
        [found, *FLAGS, "-x", "c++", "-", "-o", os.devnull],
        input=probe,
        text=True,
        capture_output=True,
    )
    return found if done.returncode == 0 else None


def _np_dtype(dtype: mx.Dtype) -> np.dtype:
    return np.dtype(str(dtype).rsplit(".", 1)[-1])


def _stdout_of(action) -> str:
    """What `action` writes to file descriptor 1 (MLX prints from C++)."""
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(1)
        os.dup2(sink.fileno(), 1)
        try:
            action()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        sink.seek(0)
        return sink.read().decode()


def mlx_kernel_source(kernel, inputs: list[mx.array], **call) -> str:
    """The complete kernel text MLX generates for this call (header, signature, body)."""

    def traced(*arrays: mx.array) -> list[mx.array]:
        return kernel(inputs=list(arrays), verbose=True, **call)

    placeholders = [mx.zeros(x.shape, x.dtype) for x in inputs]
    with tempfile.TemporaryDirectory() as tmp:
        printed = _stdout_of(
            lambda: mx.export_function(str(Path(tmp) / "k.mlxfn"), traced, *placeholders)
        )
    found = re.search(r"```\n(.*)\n```", printed, flags=re.S)
    if found is None:
        raise EmulationError(f"MLX printed no kernel source: {printed[-500:]!r}")
    return found.group(1)


@dataclass
class Signature:
    """The generated kernel's name (with template arguments) and its parameters in order."""

    call: str
    buffers: list[tuple[str, str, str, int]] = field(default_factory=list)  # space, type, ref, i
    attributes: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)


def parse_signature(text: str) -> Signature:
    found = re.search(r"\[\[kernel\]\] void (\w+)\(\n(.*?)\) \{\n", text, flags=re.S)
    if found is None:
        raise EmulationError("no [[kernel]] signature in the generated source")
    instance = re.search(r"decltype\((\w+<[^>]*>)\)", text)
    sig = Signature(instance.group(1) if instance else found.group(1))
    for line in found.group(2).split(",\n"):
        if m := _PARAM.match(line):
            sig.buffers.append((m["space"], m["type"], m["ref"], int(m["index"])))
            sig.order.append(f"b{len(sig.buffers) - 1}")
        elif m := _ATTRIBUTE.match(line):
            sig.attributes.append(m["name"])
            sig.order.append(f"p.{m['name']}")
        else:
            raise EmulationError(f"parameter not emulated: {line.strip()}")
    return sig


MAIN = r"""
#include <cstdio>
// stdin: grid xyz, threadgroup xyz, buffer count (uint32), then per buffer its byte count
// (uint64) and bytes; stdout: the buffers from FIRST_OUTPUT on.
int main() {
  uint32_t head[7];
  if (fread(head, 4, 7, stdin) != 7) return 1;
  std::vector<std::vector<uint64_t>> bufs(head[6]);
  std::vector<uint64_t> sizes(head[6]);
  for (uint32_t i = 0; i < head[6]; ++i) {
    if (fread(&sizes[i], 8, 1, stdin) != 1) return 1;
    bufs[i].resize(sizes[i] / 8 + 1);
    if (fread(bufs[i].data(), 1, sizes[i], stdin) != sizes[i]) return 1;
  }
  stoke_metal::dispatch_threads(uint3(head[0], head[1], head[2]), uint3(head[3], head[4], head[5]),
                                [&](const stoke_metal::Position& p) { CALL; });
  for (uint32_t i = FIRST_OUTPUT; i < head[6]; ++i) fwrite(bufs[i].data(), 1, sizes[i], stdout);
  return 0;
}
"""


def _kernel_part(text: str, header: str) -> tuple[str, str]:
    """The generated text as the emulation compiles it (its kernel's `threadgroup` arrays made
    statics shared by the group's threads, its header's parameters plain pointers), and the
    kernel's part of it (signature, body, instantiation)."""
    if not text.startswith(header):
        raise EmulationError("the generated source does not start with the kernel's header")
    body = text[len(header) :]
    wrapped = (
        f"{header}\n#undef threadgroup\n#define threadgroup static\n{body}\n"
        "#undef threadgroup\n#define threadgroup\n"
    )
    return wrapped, body


def translation_unit(text: str, header: str, n_inputs: int) -> str:
    """The generated text with the emulation's header and a main that launches it."""
    wrapped, body = _kernel_part(text, header)
    sig = parse_signature(body)
    args = []
    for item in sig.order:
        if item.startswith("b"):
            _, type_name, ref, index = sig.buffers[int(item[1:])]
            pointer = f"reinterpret_cast<{type_name}*>(bufs[{index}].data())"
            args.append(pointer if ref == "*" else f"*{pointer}")
        else:
            args.append(item)
    main = MAIN.replace("CALL", f"{sig.call}({', '.join(args)})").replace(
        "FIRST_OUTPUT", str(n_inputs)
    )
    return f'#include "metal_on_cpu.h"\n{wrapped}{main}'


_built: dict[str, Path] = {}


def build(source: str, cxx: str, *, link: bool = True) -> Path:
    """Compiles a translation unit to a program, or with link=False to an object file (once:
    the result is kept under its source's hash)."""
    header = HEADER.read_text()
    parts = [source, header, cxx, *FLAGS, str(link)]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    if key in _built:
        return _built[key]
    folder = CACHE / key
    binary = folder / ("kernel" if link else "kernel.o")
    if not binary.exists():
        folder.mkdir(parents=True, exist_ok=True)
        files = {"metal_on_cpu.h": header}
        files |= dict.fromkeys(STUBS, '#include "metal_on_cpu.h"\n')
        for file_name, text in files.items():  # replaced whole: a compile beside never sees half
            staged = folder / f"{file_name}.{os.getpid()}"
            staged.write_text(text)
            staged.replace(folder / file_name)
        own = folder / f"kernel.{os.getpid()}.cpp"  # sessions side by side never share a file
        own.write_text(source)
        partial = folder / f"kernel.{os.getpid()}"
        command = [cxx, *FLAGS, *([] if link else ["-c"]), "-I", str(folder)]
        done = subprocess.run(
            [*command, str(own), "-o", str(partial)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise EmulationError(f"the kernel did not compile:\n{done.stderr[-6000:]}")
        partial.replace(binary)
        own.replace(folder / "kernel.cpp")
    _built[key] = binary
    return binary


class EmulatedKernel:
    """A stand-in for mx.fast.metal_kernel's result that runs the kernel on a CPU thread."""

    def __init__(
        self,
        name: str,
        input_names: list[str],
        output_names: list[str],
        source: str,
        header: str = "",
        ensure_row_contiguous: bool = True,
        atomic_outputs: bool = False,
    ) -> None:
        if not ensure_row_contiguous or atomic_outputs:
            raise EmulationError("only row-contiguous inputs and plain outputs are emulated")
        self.name = name
        self.header = header
        self.n_outputs = len(output_names)
        self.mlx = MLX_METAL_KERNEL(
            name=name,
            input_names=input_names,
            output_names=output_names,
            source=source,
            header=header,
            ensure_row_contiguous=ensure_row_contiguous,
            atomic_outputs=atomic_outputs,
        )

    def __call__(
        self,
        *,
        inputs: list[mx.array],
        output_shapes: list[tuple[int, ...]],
        output_dtypes: list[mx.Dtype],
        grid: tuple[int, int, int],
        threadgroup: tuple[int, int, int],
        template: list[tuple[str, object]] | None = None,
        init_value: float | None = None,
        verbose: bool = False,
        stream: object = None,
    ) -> list[mx.array]:
        cxx = compiler()
        if cxx is None:
            raise EmulationError("no C++20 compiler with ucontext")
        call = dict(
            output_shapes=output_shapes,
            output_dtypes=output_dtypes,
            grid=grid,
            threadgroup=threadgroup,
            template=template or [],
            init_value=init_value,
        )
        text = mlx_kernel_source(self.mlx, inputs, **call)
        binary = build(translation_unit(text, self.header, len(inputs)), cxx)
        buffers = [np.ascontiguousarray(np.array(x)).tobytes() for x in inputs]
        for shape, dtype in zip(output_shapes, output_dtypes, strict=True):
            np_type = _np_dtype(dtype)
            poison = np.nan if np_type.kind == "f" else 0x7F7F7F7F  # "never written"
            fill = poison if init_value is None else init_value
            buffers.append(np.full(shape, fill, np_type).tobytes())
        payload = np.array([*grid, *threadgroup, len(buffers)], np.uint32).tobytes()
        for data in buffers:
            payload += np.array([len(data)], np.uint64).tobytes() + data
        done = subprocess.run([str(binary)], input=payload, capture_output=True, timeout=600)
        if done.returncode:
            raise EmulationError(done.stderr.decode(errors="replace")[-2000:])
        outputs, at = [], 0
        for shape, dtype in zip(output_shapes, output_dtypes, strict=True):
            n = int(np.prod(shape)) * _np_dtype(dtype).itemsize
            array = np.frombuffer(done.stdout[at : at + n], _np_dtype(dtype)).reshape(shape)
            outputs.append(mx.array(array))
            at += n
        return outputs


def threadgroup_bytes(kernels: list[tuple[str, str]], cxx: str) -> list[int]:
    """Threadgroup memory each generated kernel text (with its header) declares: the sizes
    of its `threadgroup` arrays as the compiler lays them out, from one object file's
    symbol table (each kernel in a namespace of its own)."""
    parts = ['#include "metal_on_cpu.h"']
    for i, (text, header) in enumerate(kernels):
        parts.append(f"namespace stoke_k{i} {{\n{_kernel_part(text, header)[0]}}}")
    listing = subprocess.run(
        ["nm", "-S", "-C", str(build("\n".join(parts), cxx, link=False))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    sizes = [0] * len(kernels)
    for line in listing.splitlines():
        if m := re.match(r"[0-9a-f]+ ([0-9a-f]+) \w stoke_k(\d+)::.*\)::\w+$", line):
            sizes[int(m[2])] += int(m[1], 16)
    return sizes
