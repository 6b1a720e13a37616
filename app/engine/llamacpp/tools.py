"""Where llama.cpp's own programs, `llama-server` and `rpc-server`, are built, and finding them.

`make llama-tools` (packaging/llama_build.py) builds both from the llama.cpp sources vendored
in the llama-cpp-python sdist Stoke pins, so they speak exactly the engine's llama.cpp. They
live outside the checkout and outside Stoke's own folders (tests give each run a fresh
STOKE_HOME), in a build cache that a CI cache or a second clone reuses:

    $STOKE_BUILD_CACHE, else $XDG_CACHE_HOME/stoke-build, else ~/.cache/stoke-build
        llama-tools/<llama-cpp-python version>-<flavor>/bin/{llama-server,rpc-server}

The flavor names the GPU backend the build targets (FLAVORS; `STOKE_LLAMA_FLAVOR`, default
metal on a Mac, cpu elsewhere). Standard library only: the build script imports this module
before the virtual environment exists.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import sys
from dataclasses import dataclass
from pathlib import Path

DISTRIBUTION = "llama-cpp-python"
# The CMake flags of each flavor; every build adds GGML_RPC=ON. CUDA needs the CUDA toolkit
# (nvcc) on PATH; Metal is what llama-cpp-python enables on a Mac anyway.
FLAVORS: dict[str, tuple[str, ...]] = {
    "cpu": (),
    "cuda": ("-DGGML_CUDA=ON",),
    "metal": ("-DGGML_METAL=ON", "-DGGML_METAL_EMBED_LIBRARY=ON"),
    "vulkan": ("-DGGML_VULKAN=ON",),
}
EXTRA_ARGS_ENV = "LLAMA_CMAKE_ARGS"  # more CMake flags, part of the cache key when set
PROGRAMS = ("llama-server", "rpc-server")


@dataclass(frozen=True)
class LlamaTools:
    """The built programs of one llama.cpp version and flavor."""

    llama_server: Path
    rpc_server: Path


def build_cache() -> Path:
    """The root of Stoke's build cache (wheels and tools), shared by every checkout."""
    if os.environ.get("STOKE_BUILD_CACHE"):
        return Path(os.environ["STOKE_BUILD_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "stoke-build"


def flavor() -> str:
    default = "metal" if sys.platform == "darwin" else "cpu"
    return os.environ.get("STOKE_LLAMA_FLAVOR") or default


def extra_cmake_args() -> tuple[str, ...]:
    return tuple(os.environ.get(EXTRA_ARGS_ENV, "").split())


def cache_key(version: str) -> str:
    """`<version>-<flavor>`, plus a hash of any extra CMake flags, so builds with different
    flags never overwrite each other."""
    key = f"{version}-{flavor()}"
    extra = extra_cmake_args()
    if extra:
        key += "-" + hashlib.sha256(" ".join(extra).encode()).hexdigest()[:8]
    return key


def tools_dir(version: str) -> Path:
    return build_cache() / "llama-tools" / cache_key(version)


def installed_version() -> str | None:
    """The llama-cpp-python this Python has, whose llama.cpp the tools must match."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def find_tools() -> tuple[LlamaTools | None, str]:
    """The built programs for the installed llama-cpp-python, or None and why, in words
    (a test's skip reason, `stoke doctor`'s line)."""
    version = installed_version()
    if version is None:
        return None, f"{DISTRIBUTION} is not installed, so no llama.cpp version to match."
    bin_dir = tools_dir(version) / "bin"
    paths = [bin_dir / name for name in PROGRAMS]
    missing = [p.name for p in paths if not os.access(p, os.X_OK)]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        return None, (
            f"llama.cpp's {' and '.join(missing)} for {DISTRIBUTION} {version} "
            f"({flavor()}) {verb} not built in {bin_dir}: run `make llama-tools`."
        )
    return LlamaTools(*paths), ""
