"""One name for one model: the header, the Models page and the API's model list all say
"SmolLM2-135M-Instruct.Q4_1" (the file), not the GGUF's general.name."""

from __future__ import annotations

import asyncio

import openai

from app.engine.gguf_info import inspect_gguf
from app.models.default import default_model_path
from tests.gui.harness import Harness
from tests.gui.test_api_server_dialog import _free_port as free_port

SMOL = "SmolLM2-135M-Instruct.Q4_1"


def test_header_library_and_api_name_the_model_alike(harness: Harness) -> None:
    window = harness.start()
    assert inspect_gguf(default_model_path()).metadata["general.name"] != SMOL
    assert window.model_label.text() == SMOL
    dialog = window.open_models()
    harness.wait_until(lambda: dialog.select_model(SMOL))
    assert dialog.details_name.text() == SMOL
    port = free_port()
    harness.run(window.api_server.start(port))
    key = window.api_server.api_key().value

    def listed() -> list[str]:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key)
        return [m.id for m in client.with_options(max_retries=0).models.list()]

    assert harness.run(asyncio.get_event_loop().run_in_executor(None, listed)) == [SMOL]
