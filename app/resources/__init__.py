"""Files Stoke ships beside its code: the palette, the style sheets and the app icon (the UI's),
and data files other rooms read.

Read through importlib.resources, so an installed Stoke (a wheel, a bundle) finds them as a
checkout does.

May import: nothing of the app (ground level).
"""

from __future__ import annotations

from importlib import resources


def read_text(name: str) -> str:
    """A file of this package as text; `name` may name a subfolder ("icons/stoke.svg")."""
    return resources.files(__name__).joinpath(name).read_text("utf-8")


def read_bytes(name: str) -> bytes:
    """A file of this package as bytes (icons)."""
    return resources.files(__name__).joinpath(name).read_bytes()
