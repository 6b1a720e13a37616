"""`stoke dev walk`: the window as a user sees it, in a real X server with a real window
manager, photographed scene by scene.

Starts Xvfb and openbox (unless DISPLAY is already set), a fresh STOKE_HOME, and the app's own
start-up on the default model, then walks the scenes below at each size and theme and saves a
PNG of the screen around the window (its frame included) per scene. The pictures of the README
and docs/ are chosen from these (`docs/`); a person looks at every one of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

SIZES = ((960, 600), (1920, 1080))
THEMES = ("light", "dark")
SCREEN = "1920x1080x24"

CODE_AND_MATH = [
    ("user", "How do I time a function in Python, and what is the mean of n samples?"),
    (
        "assistant",
        "Use `time.perf_counter()` around the call:\n\n"
        "```python\nimport time\n\nstart = time.perf_counter()\nwork()\n"
        'elapsed = time.perf_counter() - start\nprint(f"{elapsed:.3f} s")\n```\n\n'
        "The mean of $n$ samples $x_1, \\dots, x_n$ is\n\n"
        "$$\\bar{x} = \\frac{1}{n} \\sum_{i=1}^{n} x_i$$\n\n"
        "and its standard error is $\\sigma / \\sqrt{n}$.",
    ),
]

RELEASE_NOTES = "# Stoke 0.4\n\n" + "".join(
    f"- Change {i}: the engine probes CPU buffer types once per machine, so Intel CPUs with "
    "AMX no longer crash at the first decode; a crash there restarts in safe mode.\n"
    for i in range(1, 40)
)
LONG_DRAFT = " ".join(
    f"Paragraph {i}: a long pasted log line with numbers {i * 7} and {i * 13}, repeated."
    for i in range(138)
)


@contextlib.contextmanager
def x_server() -> Iterator[None]:
    """Xvfb and openbox for this process's Qt, unless a display is already there."""
    if os.environ.get("DISPLAY"):
        yield
        return
    missing = [tool for tool in ("Xvfb", "openbox") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(
            f"stoke dev walk needs {' and '.join(missing)} (Debian: apt install xvfb openbox)"
        )
    display = f":{90 + os.getpid() % 9}"
    xvfb = subprocess.Popen(
        ["Xvfb", display, "-screen", "0", SCREEN, "-nolisten", "tcp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.environ["DISPLAY"] = display
    deadline = time.monotonic() + 20
    while not Path(f"/tmp/.X11-unix/X{display[1:]}").exists():
        if time.monotonic() > deadline or xvfb.poll() is not None:
            raise SystemExit("Xvfb did not start")
        time.sleep(0.1)
    wm = subprocess.Popen(["openbox"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        for proc in (wm, xvfb):
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


class Walk:
    """One window, driven through the scenes; `shoot` saves what the screen shows."""

    def __init__(self, out: Path) -> None:
        from app.engine.protocol import LoadOptions
        from app.models.default import default_model_path

        self.out = out
        self.home = Path(os.environ["STOKE_HOME"])  # the walk's own files stay out of `out`
        self.options = LoadOptions(str(default_model_path()), n_ctx=4096)
        self.window = None
        self.session = None
        self.shots: list[Path] = []

    async def settle(self, seconds: float = 0.6) -> None:
        """Let layouts, the markdown and the window manager catch up before a picture."""
        await asyncio.sleep(seconds)  # the Qt loop runs meanwhile: qasync drives both

    async def shoot(self, name: str, widget=None) -> None:
        """The screen around `widget` (default: the window), frame and shadow included."""
        from PySide6.QtWidgets import QApplication

        await self.settle()
        target = widget or self.window
        frame = target.frameGeometry()
        screen = QApplication.primaryScreen()
        pixmap = screen.grabWindow(0, frame.x(), frame.y(), frame.width(), frame.height())
        path = self.out / f"{name}.png"
        pixmap.save(str(path))
        self.shots.append(path)
        print(path, flush=True)

    async def run(self, sizes: tuple[tuple[int, int], ...], themes: tuple[str, ...]) -> None:
        from app.ui.app import open_window, shutdown

        self.window, self.session = await open_window(self.options, None, themes[0])
        try:
            await self.session.engine.ready()
            self.window.move(0, 0)
            await self.first_run()
            self.seed_library()
            self.seed_conversation()
            for theme in themes:
                self.window.apply_theme(theme)
                for width, height in sizes:
                    self.window.showNormal()
                    self.window.resize(width, height)
                    if (width, height) == SIZES[-1]:  # the whole screen: as a user maximizes
                        self.window.showMaximized()
                    await self.scenes(f"{theme}-{width}x{height}")
        finally:
            self.window.close()
            await shutdown(self.window, self.session)

    async def first_run(self) -> None:
        """What a new user sees first: the window as start-up leaves it."""
        from app.ui.app import first_run

        self.window.resize(1280, 800)
        shown = first_run(self.window)
        await self.settle(3.0)
        await self.shoot("first-run", shown)
        if shown is not None:
            shown.close()

    def seed_library(self) -> None:
        """A second model beside the bundled one, so the picker and the library have a choice:
        a scaled DeepSeek V4 (the flagship's architecture, a few MB), linked as a user would."""
        from app.hardware.synthetic_gguf import write_deepseek4
        from app.models.library import Library

        model = write_deepseek4(self.home / "DeepSeek-V4-Flash-scaled.gguf", mode="scaled")
        Library().import_model(model, mode="link")
        self.window.model_switcher.refresh()

    def seed_conversation(self) -> None:
        """A conversation with code and math, imported as a user would import an export."""
        from app.conversations.export import FORMAT, VERSION

        now = time.time()
        messages = []
        for i, (role, content) in enumerate(CODE_AND_MATH):
            messages.append(
                {
                    "id": f"m{i}",
                    "parent_id": f"m{i - 1}" if i else None,
                    "role": role,
                    "content": content,
                    "created_at": now + i,
                }
            )
        data = {
            "format": FORMAT,
            "version": VERSION,
            "conversation": {
                "id": "walk",
                "title": "Timing Python code",
                "system_prompt": None,
                "sampling": {},
                "model": None,
                "created_at": now,
                "current_leaf_id": messages[-1]["id"],
            },
            "messages": messages,
        }
        export = self.home / "walk-conversation.json"
        export.write_text(json.dumps(data), "utf-8")
        try:
            self.window.import_from(export)  # File > Import's own path
        finally:
            export.unlink()

    async def scenes(self, tag: str) -> None:
        await self.shoot(f"chat-{tag}")
        await self.settings_panel(tag)
        await self.picker(tag)
        await self.attachment(tag)
        await self.meter_near_full(tag)
        for name, opener in self.dialogs():
            dialog = opener()
            await self.settle(3.0)  # the wizard and the library read the model off the UI thread
            await self.shoot(f"{name}-{tag}", dialog)
            dialog.close()
        await self.serving(tag)

    async def settings_panel(self, tag: str) -> None:
        """The conversation settings panel open beside the conversation (issue 36: it clipped
        at 960 x 600)."""
        self.window.toggle_settings()
        await self.shoot(f"settings-{tag}")
        self.window.toggle_settings()

    async def type(self, text: str) -> None:
        """Put `text` in the composer and wait for its prefill: the composer's pause, then the
        prewarm's (debounced) work, so the counts on screen are the engine's."""
        self.window.composer.editor.setPlainText(text)  # as typing (set_draft is not)
        await self.settle(1.0)
        await self.window.prewarm.idle()

    async def picker(self, tag: str) -> None:
        """The header's model picker, open."""
        picker = self.window.model_switcher.picker
        picker.showPopup()
        await self.shoot(f"picker-{tag}")
        picker.hidePopup()

    async def attachment(self, tag: str) -> None:
        """A file attached to the draft (prefilled at once) and a question being typed."""
        notes = self.home / "release-notes.md"
        notes.write_text(RELEASE_NOTES, "utf-8")
        try:
            self.window.draft_files.bar.attach(notes)
            await self.window.prewarm.idle()
            await self.type("What changed for people on Intel CPUs?")
            await self.shoot(f"attachment-{tag}")
        finally:
            self.window.composer.set_draft("")
            self.window.draft_files.take()
            notes.unlink()

    async def meter_near_full(self, tag: str) -> None:
        """A new conversation whose draft fills most of the context: the meter warns."""
        here = self.window.conversation_id
        self.window.new_conversation()
        await self.type(LONG_DRAFT)
        await self.shoot(f"meter-{tag}")
        self.window.composer.set_draft("")
        if here is not None:
            self.window.open_conversation(here)

    def dialogs(self) -> list[tuple[str, Callable]]:
        return [
            ("models", self.window.open_models),
            ("hardware", self.window.open_hardware_wizard),
        ]

    async def serving(self, tag: str) -> None:
        """The API Server dialog while the server runs."""
        from app.settings import Settings

        port = Settings.load().serve_port
        await self.window.api_server.start(port)
        try:
            dialog = self.window.open_api_server_settings()
            await self.settle(1.0)
            await self.shoot(f"api-serving-{tag}", dialog)
            dialog.close()
        finally:
            await self.window.api_server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stoke dev walk", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("walk"), help="folder for the PNGs")
    parser.add_argument("--small-only", action="store_true", help="only 960 x 600")
    parser.add_argument("--theme", choices=THEMES, help="only this theme")


def run(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = SIZES[:1] if args.small_only else SIZES
    themes = (args.theme,) if args.theme else THEMES
    with tempfile.TemporaryDirectory(prefix="stoke-walk-") as home, x_server():
        os.environ["STOKE_HOME"] = home
        os.environ["QT_QPA_PLATFORM"] = "xcb"
        from app import paths

        paths.start_private()
        import qasync
        from PySide6.QtWidgets import QApplication

        app = QApplication.instance() or QApplication(sys.argv[:1])
        app.setApplicationName("Stoke")
        app.setQuitOnLastWindowClosed(False)
        loop = qasync.QEventLoop(app)
        asyncio.set_event_loop(loop)
        walk = Walk(args.out)
        with loop:
            loop.run_until_complete(walk.run(sizes, themes))
    print(f"{len(walk.shots)} screenshots in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
