"""Writing a small file so that a crash, a full disk or a second process never leaves half of it.

Ground level: imports nothing of Stoke's. The file is written beside its target, flushed to
disk, then renamed over it (a rename is atomic on one filesystem), then the folder is synced
so the rename itself survives a power cut. Files are private to the user (0600).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

PRIVATE_FILE = 0o600


def write_atomic(path: Path, data: bytes | str, *, mode: int = PRIVATE_FILE) -> None:
    """Replace `path` with `data` all at once; on any error the old file is left as it was."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    _sync_dir(path.parent)


def _sync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
