"""What need not ship, cut from the Linux bundle: during analysis (stoke.spec calls
`keep_binaries`) and on the built folder (build.py calls `trim`).

PyInstaller collects every Qt plugin of the modules Stoke imports, the Qt libraries and,
from the build machine, every system library those plugins link. Stoke's window needs the
xcb, Wayland and offscreen platforms, the SVG and common image formats, and the portal
theme; the GTK 3 theme alone drags in GTK, GDK, Cairo and Pango, and transformers names
libcudart by ctypes though nothing here runs CUDA through it. A Qt or system library stays
only when a kept binary links it. Qt's translations go too: Stoke installs no translator, so
none is ever loaded.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

UNUSED = (
    "PySide6/Qt/plugins/platformthemes/libqgtk3.so",
    "PySide6/Qt/plugins/platforms/libqeglfs.so",
    "PySide6/Qt/plugins/platforms/libqlinuxfb.so",
    "PySide6/Qt/plugins/platforms/libqminimalegl.so",
    "PySide6/Qt/plugins/platforms/libqvkkhrdisplay.so",
    "PySide6/Qt/plugins/platforms/libqvnc.so",
    "PySide6/Qt/plugins/egldeviceintegrations/*",
    "PySide6/Qt/plugins/generic/*",
    "libcudart.so*",
)
_NEEDED = re.compile(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]")
# llama.cpp's libraries come from the wheel as three copies each (libggml.so, .so.0,
# .so.0.25.3): one file stays, under the name the others link (SONAME), the loader's name
# (libX.so, what ctypes opens) becomes a link to it, and the full version goes.
_VERSIONED = re.compile(r"^(lib[\w.+-]+?\.so)\.(\d+)$")


def needed(path: str | Path) -> list[str]:
    """The shared libraries an ELF file links by name (DT_NEEDED)."""
    out = subprocess.run(
        ["readelf", "-d", str(path)], capture_output=True, text=True, check=False
    ).stdout
    return _NEEDED.findall(out)


def _linked_only(dest: str, src: str, typecode: str) -> bool:
    """A library that is there for what links it: Qt's own, or one PyInstaller found on the
    build machine (not one a Python package ships and loads itself)."""
    if typecode != "BINARY" or dest.startswith("libpython"):  # the bootloader loads Python
        return False
    return dest.startswith("PySide6/Qt/lib/") or ("/" not in dest and "site-packages" not in src)


def keep_binaries(binaries: Iterable[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """PyInstaller's binaries less UNUSED, and less the system libraries only they linked."""
    entries = [e for e in binaries if not any(fnmatch.fnmatch(e[0], p) for p in UNUSED)]
    linked = {Path(e[0]).name: e for e in entries if _linked_only(*e)}
    kept = [e for e in entries if not _linked_only(*e)]
    todo = [src for _, src, _ in kept]
    reached: set[str] = set()
    while todo:
        for name in needed(todo.pop()):
            if name in linked and name not in reached:
                reached.add(name)
                todo.append(linked[name][1])
    return kept + [linked[name] for name in sorted(reached)]


def dedupe_llama_libs(lib: Path) -> list[Path]:
    """Replace the copies of each llama.cpp library by one file and a link; the removed and
    linked paths are returned."""
    changed = []
    for soname in sorted(lib.glob("lib*.so.*")):
        match = _VERSIONED.match(soname.name)
        if match is None or soname.is_symlink():
            continue
        for full in lib.glob(f"{soname.name}.*"):
            full.unlink()
            changed.append(full)
        loader = lib / match.group(1)
        if loader.is_file() and not loader.is_symlink():
            loader.unlink()
            loader.symlink_to(soname.name)
            changed.append(loader)
    return changed


def strip(files: Iterable[Path]) -> None:
    """Symbols out of the engines' libraries (llama.cpp's, built here, and MLX's, which its
    wheel ships with a symbol table); other wheels' libraries are stripped already, and
    their auditwheel-patched copies break under strip, so only these are touched."""
    for path in files:
        if not path.is_symlink():
            subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)


def trim(bundle: Path) -> None:
    """The built one-folder bundle, trimmed in place."""
    internal = bundle / "_internal"
    shutil.rmtree(internal / "PySide6" / "Qt" / "translations", ignore_errors=True)
    lib = internal / "llama_cpp" / "lib"
    dedupe_llama_libs(lib)
    strip([*lib.glob("lib*.so*"), *(internal / "mlx" / "lib").glob("lib*.so")])
