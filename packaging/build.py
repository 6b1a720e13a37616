"""`make package`: the Linux bundle, wrapped as a .deb and a portable tarball in dist/ (on
a Mac: Stoke.app in a .dmg, `build_dmg`).

Steps: the icons (icons.py), the PyInstaller one-folder bundle (stoke.spec), trimming what
need not ship (trim.py), then the .deb (dpkg-deb, /opt/stoke with /usr/bin/stoke linking
into it) and the tarball (the same folder plus its desktop files). The bundle is cached under
build/package/<version>-<key>/, the key hashing every source file that goes in and every
installed distribution's version, so a second `make package` (or the package test) with
nothing changed reuses it. Prints the result as one JSON line last.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import icons  # packaging/ is sys.path[0] when this runs as a script
import trim

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "packaging"
LINUX = HERE / "linux"
DIST = ROOT / "dist"
CACHE = ROOT / "build" / "package"
INSTALL_DIR = Path("opt") / "stoke"
APP_ID = "org.stoke.Stoke"
SOURCES = ("app", "resources", "packaging", "pyproject.toml")
# What the bundle takes from the system: the C library, and the X11/Wayland, OpenGL and font
# libraries Qt's window needs (the ones app/qt_check.py names when one is missing).
DEPENDS = (
    "libgomp1",
    "libstdc++6",
    "libgl1",
    "libegl1",
    "libfontconfig1",
    "libfreetype6",
    "libglib2.0-0",
    "libdbus-1-3",
    "libxkbcommon0",
    "libxkbcommon-x11-0",
    "libx11-xcb1",
    "libxcb1",
    "libxcb-cursor0",
    "libxcb-icccm4",
    "libxcb-image0",
    "libxcb-keysyms1",
    "libxcb-randr0",
    "libxcb-render-util0",
    "libxcb-shape0",
    "libxcb-xinerama0",
    "libxcb-xkb1",
)


def depends() -> list[str]:
    """DEPENDS, after the C library the bundle was built against (its libraries need it)."""
    libc = platform.libc_ver()[1]
    return [f"libc6 (>= {libc})", *DEPENDS]


def version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        return tomllib.load(fh)["project"]["version"]


def source_files() -> list[Path]:
    """What goes into the bundle from this checkout: tracked and new files, not ignored ones."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SOURCES],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return sorted(ROOT / name for name in listed.decode().split("\0") if name)


def cache_key() -> str:
    """A hash of the sources, the interpreter and every installed distribution's version."""
    digest = hashlib.sha256(f"{sys.version}\n{platform.machine()}\n".encode())
    for path in source_files():
        if path.is_file():
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    digest.update("\n".join(dists).encode())
    return digest.hexdigest()[:16]


def _run(command: list[str], **kwargs: object) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)  # type: ignore[call-overload]


def pyinstaller(work: Path, release: str) -> Path:
    """Run stoke.spec with its outputs under `work`; returns PyInstaller's dist folder (the
    one-folder `stoke` on Linux, beside `Stoke.app` on macOS)."""
    icons.icns(icons.APP_ICON, work / "stoke.icns")
    env = {**os.environ, "STOKE_BUILD": str(work), "STOKE_VERSION": release}
    env["QT_QPA_PLATFORM"] = "offscreen"  # hooks import Qt to find its plugins
    _run(
        [
            *(sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean"),
            *("--log-level", "WARN", "--distpath", str(work / "dist")),
            *("--workpath", str(work / "work"), str(HERE / "stoke.spec")),
        ],
        env=env,
    )
    shutil.rmtree(work / "work")
    return work / "dist"


def metainfo(release: str) -> str:
    """The AppStream file with this release's version and date (SOURCE_DATE_EPOCH's, for a
    reproducible build, else today's)."""
    date = time.strftime(
        "%Y-%m-%d", time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", 0)) or None)
    )
    text = (LINUX / f"{APP_ID}.metainfo.xml").read_text()
    return text.replace("@VERSION@", release).replace("@DATE@", date)


def desktop_files(share: Path, release: str) -> None:
    """The .desktop entry, the AppStream metainfo and the hicolor icons under `share`."""
    (share / "applications").mkdir(parents=True, exist_ok=True)
    shutil.copy(LINUX / "stoke.desktop", share / "applications" / "stoke.desktop")
    (share / "metainfo").mkdir(parents=True, exist_ok=True)
    (share / "metainfo" / f"{APP_ID}.metainfo.xml").write_text(metainfo(release))
    icons.hicolor(icons.APP_ICON, share)


def _size_kib(folder: Path) -> int:
    total = sum(p.lstat().st_size for p in folder.rglob("*") if not p.is_dir())
    return (total + 1023) // 1024


def build_deb(bundle: Path, work: Path, release: str) -> Path:
    """dist/stoke_<version>_<arch>.deb: /opt/stoke, /usr/bin/stoke, the desktop files."""
    root = work / "deb"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(bundle, root / INSTALL_DIR, symlinks=True)
    launcher = root / "usr" / "bin" / "stoke"
    launcher.parent.mkdir(parents=True)
    launcher.symlink_to(Path("../..") / INSTALL_DIR / "stoke")  # relative: any --root works
    desktop_files(root / "usr" / "share", release)
    doc = root / "usr" / "share" / "doc" / "stoke"
    doc.mkdir(parents=True)
    (doc / "copyright").write_text(
        "Stoke is MIT licensed. The bundle includes Qt (LGPLv3), llama.cpp (MIT), MLX (MIT),\n"
        "SmolLM2-135M-Instruct (Apache-2.0) and the Python packages listed by `stoke doctor`.\n"
    )
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()
    control = root / "DEBIAN" / "control"
    control.parent.mkdir()
    control.write_text(
        f"Package: stoke\nVersion: {release}\nArchitecture: {arch}\n"
        "Maintainer: The Stoke developers <stoke@localhost>\n"
        f"Installed-Size: {_size_kib(root)}\nDepends: {', '.join(depends())}\n"
        "Section: utils\nPriority: optional\n"
        "Description: chat with large local models, fast in long conversations\n"
        " Stoke keeps every reply as the exact tokens the model sampled, so a follow-up\n"
        " turn only reads what is new. It bundles llama.cpp, MLX and a small default\n"
        " model (SmolLM2-135M-Instruct), so it chats with no download.\n"
    )
    deb = work / "out" / f"stoke_{release}_{arch}.deb"
    deb.parent.mkdir(exist_ok=True)
    # zstd: a few seconds where xz takes minutes on 2 cores, for ~25% more bytes; every dpkg
    # that can run this bundle (glibc >= the build's: Debian 12, Ubuntu 23.04 on) reads it.
    _run(["dpkg-deb", "--root-owner-group", "-Zzstd", "-z9", "--build", str(root), str(deb)])
    shutil.rmtree(root)
    return deb


def build_tarball(bundle: Path, work: Path, release: str) -> Path:
    """dist/stoke-<version>-linux-<machine>.tar.gz (gzip: any tar opens it): run
    `stoke-<version>/stoke` from anywhere; its share/ holds the desktop entry and icons to
    copy into ~/.local/share."""
    name = f"stoke-{release}"
    stage = work / "tar"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(bundle, stage / name, symlinks=True, copy_function=os.link)
    desktop_files(stage / name / "share", release)
    tarball = work / "out" / f"{name}-linux-{platform.machine()}.tar.gz"
    tarball.parent.mkdir(exist_ok=True)
    _run(["tar", "-C", str(stage), "--owner=0", "--group=0", "-czf", str(tarball), name])
    shutil.rmtree(stage)
    return tarball


def publish(built: Path) -> Path:
    """`built` (under the cache) into dist/, replacing what an earlier build left there."""
    DIST.mkdir(exist_ok=True)
    target = DIST / built.name
    target.unlink(missing_ok=True)
    try:
        os.link(built, target)
    except OSError:  # another file system
        shutil.copy2(built, target)
    return target


def build_dmg(work: Path, release: str) -> Path:
    """macOS (untested here: packaging/README.md): Stoke.app and dist/Stoke-<v>-arm64.dmg."""
    import dmgbuild  # the `packaging` extra installs it on macOS

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    app = pyinstaller(work, release) / "Stoke.app"
    dmg = work / "out" / f"Stoke-{release}-arm64.dmg"
    dmg.parent.mkdir()
    settings = HERE / "macos" / "dmg_settings.py"
    dmgbuild.build_dmg(str(dmg), "Stoke", str(settings), defines={"app": str(app)})
    return publish(dmg)


def main() -> int:
    release = version()
    work = CACHE / f"{release}-{cache_key()}"
    if sys.platform == "darwin":
        print(json.dumps({"version": release, "dmg": str(build_dmg(work, release))}))
        return 0
    stamp = work / "built.json"
    if stamp.is_file():
        built = json.loads(stamp.read_text())
        outputs = [work / "out" / Path(built[k]).name for k in ("deb", "tarball")]
        if all(path.is_file() for path in outputs):
            for path in outputs:
                publish(path)
            print(json.dumps({**built, "cached": True}))
            return 0
    started = time.perf_counter()
    bundle = work / "dist" / "stoke"
    if not (bundle / "stoke").is_file():
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        bundle = pyinstaller(work, release) / "stoke"
        trim.trim(bundle)
    built = {
        "version": release,
        "bundle": str(bundle),
        "bundle_bytes": _size_kib(bundle) * 1024,
        "deb": str(publish(build_deb(bundle, work, release))),
        "tarball": str(publish(build_tarball(bundle, work, release))),
    }
    built["deb_bytes"] = Path(built["deb"]).stat().st_size
    built["tarball_bytes"] = Path(built["tarball"]).stat().st_size
    built["build_s"] = round(time.perf_counter() - started, 1)
    stamp.write_text(json.dumps(built, indent=2))
    for old in CACHE.glob("*-*"):  # earlier builds: half a gigabyte each
        if old != work and (old / "built.json").is_file():
            shutil.rmtree(old)
    print(json.dumps({**built, "cached": False}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
