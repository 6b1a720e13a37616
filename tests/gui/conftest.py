"""GUI tests run offscreen: no display needed, nothing flashes on the developer's screen."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
