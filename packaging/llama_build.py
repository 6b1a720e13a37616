"""Builds the llama.cpp that Stoke runs, from the sources of the pinned llama-cpp-python sdist.

Two products, both cached in the build cache (app/engine/llamacpp/tools.py says where) under
`<llama-cpp-python version>-<flavor>`, so a second run, a second clone or a CI job with that
folder cached builds nothing:

- `install --python PY`: the engine's llama-cpp-python wheel built with GGML_RPC=ON (and the
  flavor's GPU flags), installed into PY's environment when what is there lacks the RPC
  backend. pip's own wheel cache ignores CMAKE_ARGS and would hand back a wheel built without
  RPC, so the wheel is built here with `pip wheel` into a folder keyed by the flags.
- `tools`: `llama-server` and `rpc-server` from the same sources: one CMake build, static
  (the two programs are self-contained, so the build tree is deleted after), Release, only
  those two targets, no tests, examples, web UI, curl or OpenSSL.

The same llama.cpp is compiled twice (once inside the wheel, once for the programs) rather than
once with the wheel pointed at the programs' libraries (llama-cpp-python's LLAMA_BUILD=OFF and
LLAMA_CPP_LIB_PATH): that would leave llama_cpp without its libraries, which the packaged app
(packaging/stoke.spec) bundles from llama_cpp/lib, and make every run depend on an environment
variable. Each build is cached, so CI pays for each once per llama-cpp-python version.

Standard library only: it runs before the virtual environment has anything in it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.engine.llamacpp import tools  # noqa: E402  (standard library only)

# One CMake build of the two programs: what they need and nothing else.
TOOLS_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_RPC=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # else the configure step downloads the web UI
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
)
# CMake target -> the name it is installed under
TARGETS = {"llama-server": "llama-server", "ggml-rpc-server": "rpc-server"}
RPC_CHECK = (
    "from app.engine.llamacpp.ggml import rpc_supported; raise SystemExit(not rpc_supported())"
)


class BuildError(Exception):
    """A step failed; the message says which and where its log is."""


def pinned_version() -> str:
    """The llama-cpp-python version pyproject.toml pins (==): what `make install` installs."""
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'"llama-cpp-python==([^";\s]+)"', text)
    if match is None:
        raise BuildError("pyproject.toml pins no llama-cpp-python version (==).")
    return match.group(1)


def flavor_args() -> list[str]:
    name = tools.flavor()
    if name not in tools.FLAVORS:
        raise BuildError(
            f"Unknown STOKE_LLAMA_FLAVOR {name!r}: use one of {', '.join(tools.FLAVORS)}."
        )
    return [*tools.FLAVORS[name], *tools.extra_cmake_args()]


def cpu_signature() -> str:
    """What a native build (llama.cpp's default GGML_NATIVE) is compiled for: the machine and,
    on Linux, its CPU's instruction-set flags. A cache restored onto another CPU (a CI cache,
    a copied home) is then rebuilt, rather than crash on an instruction that CPU lacks."""
    flags = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line.split(":", 1)[1].strip()
                break
    return hashlib.sha256(f"{platform.machine()} {flags}".encode()).hexdigest()[:12]


def run(command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    """Run a build step with its output in `log` (CI shows the tail when it fails)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"$ {' '.join(command)}\n".encode())
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise BuildError(f"{command[0]} {command[1]} failed; the log is {log}:\n{tail}")


def sdist(version: str, python: str) -> Path:
    """The llama-cpp-python sdist of `version`, downloaded once into the build cache."""
    folder = tools.build_cache() / "sdist"
    found = sorted(folder.glob(f"llama_cpp_python-{version}.tar.gz"))
    if found:
        return found[0]
    command = [python, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
    run([*command, "-d", str(folder), f"{tools.DISTRIBUTION}=={version}"], folder / "pip.log")
    found = sorted(folder.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not found:
        raise BuildError(f"pip downloaded no llama-cpp-python {version} sdist into {folder}.")
    return found[0]


def wheel(version: str, python: str) -> Path:
    """The RPC-enabled wheel, built from the sdist once per version and flags."""
    folder = tools.build_cache() / "wheels" / tools.cache_key(version)
    found = sorted(folder.glob("llama_cpp_python-*.whl"))
    cpu = folder / "cpu.txt"
    if found and cpu.exists() and cpu.read_text().strip() == cpu_signature():
        return found[0]
    source = sdist(version, python)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    env = {**os.environ, "CMAKE_ARGS": " ".join(["-DGGML_RPC=ON", *flavor_args()])}
    started = time.monotonic()
    print(f"Building {tools.DISTRIBUTION} {version} with RPC (a few minutes)...", flush=True)
    command = [python, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(partial)]
    run([*command, str(source)], partial / "build.log", env)
    (partial / "build.log").unlink()
    (partial / "cpu.txt").write_text(cpu_signature() + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    print(f"Built in {time.monotonic() - started:.0f} s: {folder}", flush=True)
    return sorted(folder.glob("llama_cpp_python-*.whl"))[0]


def has_rpc(python: str) -> bool:
    """Whether the llama_cpp that `python` imports has the RPC backend."""
    done = subprocess.run([python, "-c", RPC_CHECK], cwd=ROOT, capture_output=True)
    return done.returncode == 0


def install(python: str) -> None:
    """The RPC wheel into `python`'s environment, unless what is there has RPC already."""
    version = pinned_version()
    if has_rpc(python) and tools_version(python) == version:
        return
    built = wheel(version, python)
    pip = [python, "-m", "pip", "install", "--quiet"]
    log = built.parent / "install.log"
    run([*pip, str(built)], log)  # with its dependencies
    if not has_rpc(python):  # the same version was there, built without RPC
        run([*pip, "--force-reinstall", "--no-deps", str(built)], log)
    if not has_rpc(python):
        raise BuildError(
            f"{built.name} was installed, but llama.cpp's RPC backend is not registered "
            f"(ggml_backend_reg_by_name('RPC') is NULL). Delete {built.parent} and rebuild."
        )


def tools_version(python: str) -> str | None:
    code = "from app.engine.llamacpp.tools import installed_version as v; print(v() or '')"
    done = subprocess.run([python, "-c", code], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or None


def build_tools(python: str) -> Path:
    """llama-server and rpc-server for the pinned version and flavor; their bin folder."""
    version = pinned_version()
    folder = tools.tools_dir(version)
    args = [*TOOLS_CMAKE_ARGS, *flavor_args()]
    if _built(folder, args):
        return folder / "bin"
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    log = partial / "build.log"
    source = sdist(version, python)
    started = time.monotonic()
    print(f"Building llama-server and rpc-server of {version} (several minutes)...", flush=True)
    with tarfile.open(source) as archive:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.11.4+
        archive.extractall(partial / "src", **safe)
    (top,) = (partial / "src").iterdir()
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    build = partial / "build"
    run(
        ["cmake", "-S", str(top / "vendor" / "llama.cpp"), "-B", str(build), *generator, *args], log
    )
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
    run(["cmake", "--build", str(build), "-j", jobs, "--target", *TARGETS], log)
    (partial / "bin").mkdir()
    for target, name in TARGETS.items():
        shutil.copy2(build / "bin" / target, partial / "bin" / name)
    seconds = round(time.monotonic() - started)
    record = {
        "version": version,
        "flavor": tools.flavor(),
        "cmake_args": args,
        "cpu": cpu_signature(),
        "seconds": seconds,
    }
    stamp_text = json.dumps(record, indent=1) + "\n"
    shutil.rmtree(partial / "src")
    shutil.rmtree(build)
    log.unlink()
    (partial / "build.json").write_text(stamp_text)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    print(f"Built in {seconds} s: {folder / 'bin'}", flush=True)
    return folder / "bin"


def _built(folder: Path, args: list[str]) -> bool:
    """Whether `folder` holds both programs, built with exactly these CMake flags for this
    CPU."""
    stamp = folder / "build.json"
    record = json.loads(stamp.read_text()) if stamp.exists() else {}
    if record.get("cmake_args") != args or record.get("cpu") != cpu_signature():
        return False
    return all((folder / "bin" / name).exists() for name in TARGETS.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("install", "tools"))
    parser.add_argument("--python", default=sys.executable, help="the environment's Python")
    args = parser.parse_args()
    try:
        if args.what == "install":
            install(args.python)
        else:
            print(build_tools(args.python))
    except BuildError as exc:
        print(f"llama_build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
