"""The Models page (File > Models…): the library on disk, Hugging Face downloads and the
catalog of recommended models, one dialog with a module per tab.

`dialog` assembles the tabs and owns the dialog's lifetime and background tasks;
`library_tab`, `downloads_tab`, `catalog_tab` and `search_tab` (the hub's model search) each
own one tab's widgets and actions;
`download_row`, `import_dialog` and `widgets` are the pieces they show; `words` is how the
page writes numbers and verdicts. Qt only: it may import `app.models` (library, downloads,
catalog, secrets, load settings), `app.hardware.detect` and the UI's `background`, `theme`,
`banner` and `a11y`; nothing imports it but the main window.
"""

from app.ui.models.dialog import ModelsDialog
from app.ui.models.download_row import DownloadRow
from app.ui.models.import_dialog import ImportDialog
from app.ui.models.words import EMPTY_DOWNLOADS, EMPTY_LIBRARY, FIT_COLORS

__all__ = [
    "EMPTY_DOWNLOADS",
    "EMPTY_LIBRARY",
    "FIT_COLORS",
    "DownloadRow",
    "ImportDialog",
    "ModelsDialog",
]
