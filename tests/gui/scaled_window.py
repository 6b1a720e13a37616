"""The window at QT_SCALE_FACTOR=2 on a 1920 x 1080 screen (960 x 540 logical): run as
`python -m tests.gui.scaled_window` by test_layout; prints what it saw as one JSON line."""

from __future__ import annotations

import json
import os
import sys
import tempfile

from PySide6.QtCore import QSize
from PySide6.QtWidgets import QApplication


def main() -> int:
    os.environ.setdefault("STOKE_HOME", tempfile.mkdtemp(prefix="stoke-scaled-"))
    app = QApplication(sys.argv)
    from tests.gui.harness import Harness
    from tests.gui.test_layout import shown_whole

    harness = Harness(app)
    try:
        window = harness.start()
        window.resize(QSize(960, 540))
        harness.act(window.toggle_settings)
        harness.wait_until(lambda: window.size() == QSize(960, 540))
        harness.act(QApplication.processEvents)
        seen = {
            "device_pixel_ratio": window.devicePixelRatio(),
            "size": list(window.size().toTuple()),
            "minimum": list(window.minimumSizeHint().toTuple()),
            "composer_whole": shown_whole(window, window.composer.editor),
            "send_whole": shown_whole(window, window.composer.send_button),
        }
    finally:
        harness.stop()
        harness.loop.close()
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
