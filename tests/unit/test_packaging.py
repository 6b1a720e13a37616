"""The parts of packaging/ that need no bundle: the frozen entry's interpreter forms, the
icons, what trim.py cuts, and that the wheel and the bundle take every asset (the built .deb
itself: tests/package/test_package.py)."""

from __future__ import annotations

import ast
import importlib.util
import re
import struct
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging"
RESOURCES = ROOT / "resources"


def _load(name: str) -> ModuleType:
    """A packaging/ script as a module (packaging/ is no package: PyPI's `packaging` is)."""
    spec = importlib.util.spec_from_file_location(
        f"stoke_packaging_{name}", PACKAGING / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


icons = _load("icons")
trim = _load("trim")


def _entry(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PACKAGING / "stoke_entry.py"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_the_entry_runs_code_as_python_c_does() -> None:
    done = _entry("-c", "import sys; print(__name__, sys.argv); raise SystemExit(3)", "a", "b")
    assert done.returncode == 3
    assert done.stdout.strip() == "__main__ ['-c', 'a', 'b']"


def test_the_entry_runs_a_module_as_python_m_does() -> None:
    """As `python -m`: the module is __main__, argv[0] its file, the rest its arguments."""
    done = _entry("-m", "json.tool", "--indent", "1", stdin='{"a": [1]}')
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{\n "a": [\n  1\n ]\n}\n'


def test_anything_else_is_the_stoke_command_line() -> None:
    done = _entry("--help")
    assert done.returncode == 0
    assert "usage: stoke" in done.stdout
    assert "doctor" in done.stdout


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


# `qapp`: icons.py draws with whatever Qt application exists, so the suite's later window
# tests still find a QApplication (a QGuiApplication made first aborts every QWidget).
def test_hicolor_has_every_size_drawn_from_the_app_icon(qapp, tmp_path: Path) -> None:
    written = icons.hicolor(icons.APP_ICON, tmp_path)
    for size in icons.HICOLOR_SIZES:
        png = tmp_path / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "stoke.png"
        assert _png_size(png.read_bytes()) == (size, size)
    scalable = tmp_path / "icons" / "hicolor" / "scalable" / "apps" / "stoke.svg"
    assert scalable.read_bytes() == icons.APP_ICON.read_bytes()
    assert len(written) == len(icons.HICOLOR_SIZES) + 1


def test_the_icns_holds_each_type_at_its_size(qapp, tmp_path: Path) -> None:
    data = icons.icns(icons.APP_ICON, tmp_path / "stoke.icns").read_bytes()
    assert data[:4] == b"icns"
    assert struct.unpack(">I", data[4:8])[0] == len(data)
    found, offset = [], 8
    while offset < len(data):
        code, length = (
            data[offset : offset + 4].decode(),
            struct.unpack(">I", data[offset + 4 : offset + 8])[0],
        )
        found.append((code, _png_size(data[offset + 8 : offset + length])[0]))
        offset += length
    assert found == list(icons.ICNS_TYPES)


def test_llama_libraries_keep_one_copy_under_their_soname(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("libggml.so", "libggml.so.0", "libggml.so.0.25.3"):
        (lib / name).write_bytes(b"ggml")
    (lib / "libmtmd.so").write_bytes(b"mtmd")  # no versioned copy: left as it is
    trim.dedupe_llama_libs(lib)
    assert sorted(p.name for p in lib.iterdir()) == [
        "libggml.so",
        "libggml.so.0",
        "libmtmd.so",
    ]
    assert (lib / "libggml.so").readlink() == Path("libggml.so.0")
    assert (lib / "libggml.so.0").read_bytes() == b"ggml"
    assert not (lib / "libmtmd.so").is_symlink()


def test_unused_plugins_go_with_the_system_libraries_only_they_link() -> None:
    """libllama links libggml-base, which links libgomp: kept; GTK came for the GTK theme."""
    lib = Path(llama_cpp.__file__).parent / "lib"
    entries = [
        ("llama_cpp/lib/libllama.so", str(lib / "libllama.so"), "BINARY"),
        ("llama_cpp/lib/libggml-base.so.0", str(lib / "libggml-base.so.0"), "BINARY"),
        ("libgomp.so.1", "/absent/libgomp.so.1", "BINARY"),
        ("libgtk-3.so.0", "/absent/libgtk-3.so.0", "BINARY"),
        ("libpython3.11.so.1.0", "/absent/libpython3.11.so.1.0", "BINARY"),
        ("PySide6/Qt/plugins/platformthemes/libqgtk3.so", "/absent/libqgtk3.so", "BINARY"),
        ("PySide6/Qt/lib/libQt6EglFSDeviceIntegration.so.6", "/absent/libQt6Egl.so", "BINARY"),
    ]
    kept = {dest for dest, _, _ in trim.keep_binaries(entries)}
    assert kept == {
        "llama_cpp/lib/libllama.so",
        "llama_cpp/lib/libggml-base.so.0",
        "libgomp.so.1",
        "libpython3.11.so.1.0",
    }


def _resource_files() -> set[Path]:
    """The assets, as paths inside resources/."""
    return {p.relative_to(RESOURCES) for p in RESOURCES.rglob("*") if p.is_file()}


def test_the_bundle_takes_every_kind_of_resource_file() -> None:
    """The frozen app holds the files of resources/ (stoke.spec collects them by suffix): a
    kind left out would be missing only in the installed app (the chat templates were)."""
    spec = (PACKAGING / "stoke.spec").read_text()
    collected = re.search(r"^RESOURCE_SUFFIXES = (\(.*?\))$", spec, re.MULTILINE)
    assert collected, "stoke.spec names no RESOURCE_SUFFIXES"
    suffixes = {f.suffix for f in _resource_files()} - {".md"}  # notes for readers of the source
    assert suffixes and suffixes <= set(ast.literal_eval(collected.group(1))), suffixes


def test_the_wheel_takes_every_resource_file_and_package() -> None:
    """pyproject.toml names every package (resources/ maps to app.resources, which a search
    under app/ cannot find) and its package-data every file of resources/, so none is missing
    only from an installed Stoke."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"app.resources": "resources"}
    files = _resource_files()
    packages = {".".join(p.parent.relative_to(ROOT).parts) for p in ROOT.glob("app/**/__init__.py")}
    packages |= {".".join(("app", "resources", *f.parent.parts)) for f in files}
    assert set(setuptools["packages"]) == packages, packages ^ set(setuptools["packages"])
    shipped = {  # setuptools' package-data patterns are globs from the package's folder
        p.relative_to(RESOURCES)
        for pattern in setuptools["package-data"]["app.resources"]
        for p in RESOURCES.glob(pattern)
    }
    assert files and files <= shipped, files - shipped
