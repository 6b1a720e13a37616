"""Files Stoke ships beside its code: the palette, the style sheets and the app icon (the UI's),
and data files other rooms read (the catalog, the Flash layout, chat templates).

They live in the checkout's top-level resources/. An installed Stoke carries them as the
folder app/resources/ beside this module (pyproject.toml maps resources/ there for a wheel,
packaging/stoke.spec for the bundle), read through importlib.resources so a wheel, a zip or
the frozen app find them alike; a checkout, or an editable install of one, reads resources/.

May import: nothing of the app (ground level).
"""

from __future__ import annotations

import functools
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1] / "resources"
# A file every copy of the assets has: an app/resources/ without it is no install's (a
# checkout's stale __pycache__ from before the move), and the checkout's folder is meant.
_PRESENT = "palette.json"


@functools.cache
def _folder() -> Traversable:
    """The assets: the installed or frozen package's app/resources/, else the checkout's."""
    installed = resources.files("app").joinpath("resources")
    return installed if installed.joinpath(_PRESENT).is_file() else CHECKOUT


def read_text(name: str) -> str:
    """An asset as text; `name` may name a subfolder ("icons/stoke.svg")."""
    return _folder().joinpath(name).read_text("utf-8")


def path(name: str) -> Path:
    """An asset's file on disk, for what Qt reads itself (a style sheet's url())."""
    return Path(str(_folder().joinpath(name)))


def read_bytes(name: str) -> bytes:
    """An asset as bytes (icons)."""
    return _folder().joinpath(name).read_bytes()
