"""Settings > Hardware opens the wizard on the running model; its plan is what loads next."""

from __future__ import annotations

import argparse
import asyncio

from app.launch import load_options_of
from app.models import load_settings
from app.models.default import default_model_path
from tests.gui.harness import Harness


def test_hardware_menu_opens_the_wizard_and_its_plan_loads_next(harness: Harness) -> None:
    window = harness.start()
    wizard = window.open_hardware_wizard()
    harness.wait_until(wizard.idle)
    assert wizard.model_path == str(default_model_path())
    harness.act(wizard.apply)
    harness.run(asyncio.shield(window.model_switcher.reloading))  # it applies now, too
    saved = load_settings.load(str(default_model_path()))
    assert saved is not None
    options = load_options_of(argparse.Namespace(model=None, ctx=None))
    assert options.n_ctx == saved["n_ctx"] and options.n_ubatch == saved["n_ubatch"]
    assert load_options_of(argparse.Namespace(model=None, ctx=1024)).n_ctx == 1024  # flags win


def test_models_page_load_switches_the_engine_to_that_model(harness: Harness) -> None:
    from app.models.library import Library

    window = harness.start()
    imported = Library().import_model(default_model_path(), "copy")
    dialog = window.open_models()
    harness.wait_until(lambda: dialog.select_model(imported.id))
    harness.act(lambda: dialog.load_requested.emit(str(imported.path)))
    harness.turn()
    assert window.session.engine.options.model_path == str(imported.path)
    assert window.session.engine.info.path == str(imported.path)
    window.store.set_sampling(window.conversation_id, {"temperature": 0, "max_tokens": 8})
    harness.type_and_send("Hello again.")
    harness.turn()
    assert window.store.current_path(window.conversation_id)[-1].status == "complete"
