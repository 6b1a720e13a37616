"""dmgbuild settings of Stoke's disk image: the app beside a link to /Applications.

packaging/build.py passes the built app as `defines["app"]` (dmgbuild runs this file with
`defines` among its globals). Used on a Mac only, and untested here (packaging/README.md).
"""

import os.path

application = globals()["defines"]["app"]
appname = os.path.basename(application)

format = "ULFO"  # LZFSE-compressed: smaller than zlib, read by every macOS Stoke runs on (14+)
filesystem = "APFS"
size = None  # as large as the app needs
files = [application]
symlinks = {"Applications": "/Applications"}
icon = os.path.join(os.path.dirname(application), "..", "stoke.icns")
background = "builtin-arrow"
default_view = "icon-view"
show_status_bar = False
show_toolbar = False
window_rect = ((200, 160), (640, 300))
icon_size = 128
icon_locations = {appname: (160, 140), "Applications": (480, 140)}
