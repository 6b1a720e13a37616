"""GUI tests run offscreen: no display needed, nothing flashes on the developer's screen."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def harness(qapp, stoke_home: Path) -> Iterator:
    """The real window on the real engine and model; stopped and its loop closed after."""
    from tests.gui.harness import Harness

    h = Harness(qapp)
    try:
        yield h
    finally:
        h.stop()
        h.loop.close()
