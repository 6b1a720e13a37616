"""A full disk under the conversation database: words that say so, and no reply lost.

The data folder is a small tmpfs of its own (a user and mount namespace, `unshare`), filled
with a file until only a little room is left; the real engine writes a real reply into it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MOUNT = 'mount -t tmpfs -o size=4m,mode=0700 stoke-full-disk "$0" && exec "$@"'


def _in_small_disk(tmp_path: Path, script: str, room: int, verdict: Path) -> dict:
    """Run `script` with STOKE_HOME on a 4 MiB tmpfs holding this machine's CPU `verdict` (as
    every test's home does: without it the engine probed the CPU, seconds of children); it
    fills the disk to `room` bytes."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private tmpfs")
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", MOUNT, str(tmp_path),
         "true"],
        capture_output=True,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip("this machine allows no private tmpfs (user namespaces are off)")
    home = tmp_path / "disk"
    home.mkdir()
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", MOUNT, str(home),
         sys.executable, "-c", textwrap.dedent(_PRELUDE + script), str(home),
         str(tmp_path / "engine.log"), str(room), str(verdict)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


_PRELUDE = """
import asyncio, json, os, shutil, sys
from pathlib import Path
home, log, room, verdict = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
os.environ["STOKE_HOME"] = str(home / "stoke")
if verdict.exists():
    (home / "stoke" / "cache").mkdir(parents=True, mode=0o700)
    shutil.copy2(verdict, home / "stoke" / "cache" / verdict.name)
from app.conversations import ConversationStore, StoreError
from app.engine.host import EngineClient
from app.engine.protocol import LoadOptions
from app.models.default import default_model_path
from app.session import ChatSession

def fill():
    stat = os.statvfs(home)
    (home / "filler").write_bytes(b"\\0" * max(0, stat.f_bavail * stat.f_frsize - room))

def reply_row(store, conversation):
    return store.current_path(conversation)[-1]
"""

_TURN = """
async def main():
    store = ConversationStore.open()
    engine = EngineClient(LoadOptions(str(default_model_path()), n_ctx=2048), log_path=log)
    await engine.start()
    session = ChatSession(store, engine)
    c = store.create_conversation(sampling={"temperature": 0, "max_tokens": 300}).id
    pieces = []
    fill()
    out = {}
    try:
        result = await session.send(
            c, "Count from 1 to 300, separated by commas.", on_token=lambda e: pieces.append(e.text)
        )
        out["status"] = result.status
    except StoreError as error:
        out["error"] = str(error)
    out["streamed"] = "".join(pieces)
    out["row_while_full"] = reply_row(store, c).content
    (home / "filler").unlink()  # room returns
    later = await session.send(c, "Thanks.")
    path = store.current_path(c)
    out["roles"] = [m.role for m in path]
    out["first_reply"] = path[1].content
    out["first_status"] = path[1].status
    out["later"] = later.status
    await engine.close()
    store.close()
    print(json.dumps(out))

asyncio.run(main())
"""


def test_little_room_left_keeps_the_whole_reply(tmp_path: Path, cpu_buffer_verdict: Path) -> None:
    out = _in_small_disk(tmp_path, _TURN, room=96 << 10, verdict=cpu_buffer_verdict)
    assert out["streamed"].startswith("1")
    assert "error" not in out or (
        "The disk is full: free" in out["error"] and "Traceback" not in out["error"]
    )
    assert out["roles"] == ["user", "assistant", "user", "assistant"]
    assert out["first_reply"] == out["streamed"]  # never an empty row
    assert out["later"] == "complete"


_NO_ROOM = """
store = ConversationStore.open()
c = store.create_conversation().id
fill()
try:
    for n in range(1000):  # until even the log has no room
        store.set_draft(c, "draft " * 200 + str(n))
    out = {"error": None}
except StoreError as error:
    out = {"error": str(error)}
print(json.dumps(out))
"""


def test_full_disk_says_so_in_words(tmp_path: Path, cpu_buffer_verdict: Path) -> None:
    error = _in_small_disk(tmp_path, _NO_ROOM, room=0, verdict=cpu_buffer_verdict)["error"]
    assert error is not None
    assert "The disk is full: free " in error and " MB" in error
    assert str(tmp_path / "disk" / "stoke") in error  # where the data lives
    assert "disk I/O error" not in error and "database or disk is full" not in error
