"""Settings > Hardware opens the wizard on the running model; its plan is what loads next."""

from __future__ import annotations

import argparse

from app.cli.chat import load_options
from app.models import load_settings
from app.models.default import default_model_path
from tests.gui.harness import Harness


def test_hardware_menu_opens_the_wizard_and_its_plan_loads_next(harness: Harness) -> None:
    window = harness.start()
    wizard = window.open_hardware_wizard()
    harness.wait_until(wizard.idle)
    assert wizard.model_path == str(default_model_path())
    harness.act(wizard.apply)
    saved = load_settings.load(str(default_model_path()))
    assert saved is not None
    options = load_options(argparse.Namespace(model=None, ctx=None))
    assert options.n_ctx == saved["n_ctx"] and options.n_ubatch == saved["n_ubatch"]
    assert load_options(argparse.Namespace(model=None, ctx=1024)).n_ctx == 1024  # flags win
