"""The hardware wizard (first run, Settings > Hardware): the devices of this machine, the
recommended engine, and a live plan of where a model's tensors go, saved as its load settings.

`wizard` is the dialog and its background jobs; `cards` its layout, built of `parts`; `remote`
the other machines' card; `chart` the per-device memory bars; `planning` the inputs and the
plan (no widgets); `words` how it writes sizes and plans. Qt only: it may import
`app.hardware` (detection, planner, memory), `app.engine`'s model checks and engine choice,
`app.models` (GGUF header, load settings), `app.settings` and the UI's `background`, `theme`
and `a11y`; nothing imports it but the main window.
"""

from app.ui.hardware.planning import CONTEXT_STOPS
from app.ui.hardware.wizard import PLAN_DEBOUNCE_MS, HardwareWizard

__all__ = ["CONTEXT_STOPS", "PLAN_DEBOUNCE_MS", "HardwareWizard"]
