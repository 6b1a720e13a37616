"""The installed app is the same app: the real .deb from `make package`, installed into a
throwaway root with dpkg, run from its /usr/bin/stoke.

The build is `packaging/build.py`, reused while the version, the sources and the installed
packages are unchanged (its cache key), so `make package-test` after `make package` only
installs and runs. Marked `package`: `make test` leaves it out, `.ci/run` runs it after.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.package,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(sys.platform != "linux", reason="the .deb is Linux's (a Mac: build_dmg)"),
]

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = ROOT / "resources"
HICOLOR = (16, 22, 24, 32, 48, 64, 96, 128, 256, 512)
APP_ID = "org.stoke.Stoke"


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    """The .deb and tarball of this checkout (built now, or the cached build of it)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "build.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _dpkg(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = ["dpkg", f"--root={root}", "--log=/dev/null", *args]
    if os.geteuid() != 0:
        if shutil.which("fakeroot") is None:
            pytest.skip("installing the .deb as a user needs fakeroot (apt-get install fakeroot)")
        command = ["fakeroot", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def root(built: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh root with the .deb installed by dpkg (its own empty package database)."""
    root = tmp_path_factory.mktemp("root")
    admin = root / "var" / "lib" / "dpkg"
    for folder in ("info", "updates", "triggers"):
        (admin / folder).mkdir(parents=True)
    (admin / "status").touch()
    # The root holds no other packages, so the system libraries it depends on are the host's.
    done = _dpkg(root, "--force-depends", "--install", built["deb"])
    assert done.returncode == 0, done.stdout + done.stderr
    listed = _dpkg(root, "--status", "stoke")
    assert "Status: install ok installed" in listed.stdout, listed.stdout + listed.stderr
    return root


@pytest.fixture
def home(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a user with an empty home: no STOKE_HOME, no XDG folders."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOKE_", "XDG_"))}
    env.update(HOME=str(tmp_path / "home"), QT_QPA_PLATFORM="offscreen")
    (tmp_path / "home").mkdir()
    yield env


def _stoke(root: Path, env: dict[str, str], *args: str, timeout: float = 300) -> Any:
    return subprocess.run(
        [str(root / "usr" / "bin" / "stoke"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=env["HOME"],
    )


def test_the_deb_installs_under_opt_with_a_launcher_and_desktop_files(root: Path) -> None:
    launcher = root / "usr" / "bin" / "stoke"
    assert launcher.is_symlink()
    assert launcher.resolve() == (root / "opt" / "stoke" / "stoke").resolve()
    assert os.access(launcher.resolve(), os.X_OK)
    share = root / "usr" / "share"
    assert (share / "applications" / "stoke.desktop").is_file()
    assert (share / "metainfo" / f"{APP_ID}.metainfo.xml").is_file()
    for size in HICOLOR:
        icon = share / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "stoke.png"
        assert icon.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", icon
    assert (share / "icons" / "hicolor" / "scalable" / "apps" / "stoke.svg").is_file()


def test_doctor_reports_the_bundle_and_loads_the_bundled_model_on_both_engines(
    root: Path, home: dict[str, str]
) -> None:
    done = _stoke(root, home, "doctor", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    bundle = (root / "opt" / "stoke").resolve()
    assert report["bundle"] == {"frozen": True, "path": str(bundle)}
    assert report["stoke"] != "not installed"
    assert report["packages"]["PySide6"] != "not installed"
    # The user's data lives in their platform folders, never beside the bundle.
    user = Path(home["HOME"])
    assert Path(report["paths"]["data_dir"]) == user / ".local" / "share" / "stoke"
    assert Path(report["paths"]["config_dir"]) == user / ".config" / "stoke"
    assert Path(report["paths"]["cache_dir"]) == user / ".cache" / "stoke"
    model = report["default_model"]
    assert model["exists"] and Path(model["path"]).is_relative_to(bundle), model
    engines = report["engines"]
    assert engines["llama.cpp"]["ok"], engines["llama.cpp"]
    assert engines["mlx"]["ok"], engines["mlx"]
    assert report["llama_cpp"]["ok"], report["llama_cpp"]
    text = _stoke(root, home, "doctor")
    assert f"runs from  installed bundle at {bundle}" in text.stdout


def test_the_installed_app_draws_its_window(root: Path, home: dict[str, str]) -> None:
    from PySide6.QtGui import QImage

    picture = Path(home["HOME"]) / "window.png"
    done = _stoke(root, home, "--screenshot", str(picture))
    assert done.returncode == 0, done.stderr[-3000:]
    image = QImage(str(picture))
    assert not image.isNull() and image.width() >= 900, (image.width(), image.height())
    colours = {image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, 600, 7)}
    assert len(colours) > 20, "the window is blank"


def test_the_installed_app_reads_every_asset(root: Path, home: dict[str, str]) -> None:
    """The bundle carries resources/ where app/resources.py reads it: every asset reads back
    through the app's own reader as the checkout has it (the notes, *.md, stay behind)."""
    files = [p for p in RESOURCES.rglob("*") if p.is_file() and p.suffix != ".md"]
    names = sorted(str(p.relative_to(RESOURCES)) for p in files)
    code = (
        "import hashlib, json, sys\nfrom app import resources\n"
        "print(json.dumps({n: hashlib.sha256(resources.read_bytes(n)).hexdigest()"
        " for n in sys.argv[1:]}))"
    )
    done = _stoke(root, home, "-c", code, *names)
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout)
    assert read == {n: hashlib.sha256((RESOURCES / n).read_bytes()).hexdigest() for n in names}


def test_the_installed_app_chats_with_the_bundled_model(root: Path, home: dict[str, str]) -> None:
    done = _stoke(root, home, "chat", "--new", "--message", "Hello", "--json", "--max-tokens", "12")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    turn = json.loads(done.stdout)
    assert turn["status"] == "complete", turn
    assert turn["reply"].strip(), turn
    assert turn["stats"]["generated_tokens"] > 0
    listed = _stoke(root, home, "chat", "--list")
    assert turn["conversation_id"][:8] in listed.stdout


def test_the_installed_app_serves_the_api(root: Path, home: dict[str, str]) -> None:
    """`stoke serve` from the launcher, spoken to with the official openai client."""
    import openai

    server = subprocess.Popen(
        [str(root / "usr" / "bin" / "stoke"), "serve", "--port", "0", "--api-key", "sk-pkg"],
        env=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        serving = next((line for line in server.stdout if line.startswith("Serving ")), "")
        assert serving, server.stderr.read() if server.stderr else ""
        url = serving.split(" at ", 1)[1].strip()
        client = openai.OpenAI(base_url=url, api_key="sk-pkg", max_retries=0)
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=8,
        )
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens > 0
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_the_desktop_entry_is_valid(root: Path) -> None:
    tool = shutil.which("desktop-file-validate")
    if tool is None:
        pytest.skip("desktop-file-validate is missing (Debian: apt-get install desktop-file-utils)")
    entry = root / "usr" / "share" / "applications" / "stoke.desktop"
    done = subprocess.run([tool, str(entry)], capture_output=True, text=True)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_the_metainfo_is_valid(root: Path) -> None:
    tool = shutil.which("appstreamcli")
    if tool is None:
        pytest.skip("appstreamcli is missing (Debian: apt-get install appstream)")
    metainfo = root / "usr" / "share" / "metainfo" / f"{APP_ID}.metainfo.xml"
    done = subprocess.run(
        [tool, "validate", "--no-net", str(metainfo)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "@VERSION@" not in metainfo.read_text()


def test_the_tarball_holds_the_same_bundle_and_runs(
    built: dict[str, Any], tmp_path: Path, home: dict[str, str]
) -> None:
    unpacked = tmp_path / "unpacked"
    with tarfile.open(built["tarball"]) as tar:
        tar.extractall(unpacked, filter="tar")
    (top,) = unpacked.iterdir()
    assert top.name == f"stoke-{built['version']}"
    assert (top / "share" / "applications" / "stoke.desktop").is_file()
    done = subprocess.run(
        [str(top / "stoke"), "chat", "--list"], env=home, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "No conversations yet" in done.stdout, done.stdout
