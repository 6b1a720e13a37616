"""`stoke chat` in a real terminal (a pty): type, read the reply, use commands, quit."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

from app.conversations import ConversationStore


class Terminal:
    def __init__(self, *args: str) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=os.environ.copy(),
            close_fds=True,
        )
        os.close(slave)
        self.screen = ""

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def wait_for(self, text: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            assert time.monotonic() < deadline, f"never saw {text!r} in:\n{self.screen}"
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.screen += os.read(self.master, 4096).decode("utf-8", "replace")
                except OSError:
                    break
        return self.screen

    def close(self) -> int:
        try:
            return self.process.wait(timeout=30)
        finally:
            os.close(self.master)


def test_interactive_chat_session():
    term = Terminal("chat", "--temperature", "0", "--max-tokens", "12")
    try:
        term.wait_for("/help for commands.")
        term.type("What is the capital of France?")
        term.wait_for("reused 0 of")
        term.type("And of Spain?")
        term.wait_for("prefilled", timeout=60)
        term.type("/regen")
        term.wait_for("reused", timeout=60)
        term.type("/bogus")
        term.wait_for("Unknown command /bogus")
        term.type("/list")
        term.wait_for("What is the capital of France?")
        term.type("/quit")
        assert term.close() == 0
    finally:
        if term.process.poll() is None:
            term.process.kill()
    screen = term.screen
    assert "Traceback" not in screen
    second_stats = screen.split("reused ")[2]
    reused, _, _ = second_stats.partition(" of ")
    assert int(reused.replace(",", "")) > 0  # the second turn reused the first one's KV
    with ConversationStore.open() as store:
        (conversation,) = store.list_conversations()
        path = store.current_path(conversation.id)
        assert [m.role for m in path] == ["user", "assistant", "user", "assistant"]
        assert len(store.siblings(path[-1].id)[0]) == 2  # /regen made a branch
