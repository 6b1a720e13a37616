"""Draft models in the library: a cut of the default model (its first two blocks, written by
`write_truncated`) shares its tokenizer and is offered as its draft; a model with another
vocabulary, and the target itself, are not."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.gguf_header import open_header
from app.engine.model_file import tokenizer_fingerprint
from app.models.default import default_model_path
from app.models.drafts import compatible_drafts
from app.models.library import Library, ModelEntry
from app.models.truncated_gguf import _nbytes, write_truncated
from tests.unit.test_library import write_gguf


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> list[ModelEntry]:
    """The default model, its 2-block cut and a model of another vocabulary, imported."""
    home = tmp_path_factory.mktemp("drafts-home")
    files = tmp_path_factory.mktemp("drafts-models")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOKE_HOME", str(home))
        library = Library()
        return [
            library.import_model(default_model_path()),
            library.import_model(write_truncated(default_model_path(), files / "cut-2.gguf", 2)),
            library.import_model(write_gguf(files / "other.gguf")[0]),
        ]


def test_a_cut_of_the_model_is_its_draft_and_others_are_not(models: list[ModelEntry]):
    target = models[0]
    drafts = compatible_drafts(target, models)
    assert [m.name for m in drafts] == ["cut-2"]
    assert drafts[0].size_bytes < target.size_bytes
    assert tokenizer_fingerprint(drafts[0].path) == tokenizer_fingerprint(target.path)
    cut = drafts[0]
    assert compatible_drafts(cut, models) == []  # the larger model cannot draft for its cut


def test_the_cut_keeps_its_first_blocks(tmp_path: Path):
    from app.engine.gguf_info import inspect_gguf

    path = write_truncated(default_model_path(), tmp_path / "cut.gguf", 3)
    cut, full = inspect_gguf(path), inspect_gguf(default_model_path())
    assert cut.block_count == 3 and full.block_count > 3
    assert {t.layer for t in cut.tensors} - {None} == {0, 1, 2}
    assert cut.vocab_size == full.vocab_size
    assert cut.metadata["general.name"] == f"{full.metadata['general.name']} (3-layer draft)"
    # every kept tensor's bytes as the source stores them (the cut copies them, not decodes)
    with open_header(path) as cut_header, open_header(default_model_path()) as full_header:
        source = {t.name: t for t in full_header.tensors()}
        for tensor in cut_header.tensors():
            kept = source[tensor.name]
            assert (tensor.dims, tensor.ggml_type) == (kept.dims, kept.ggml_type)
            size = _nbytes(tensor.dims, tensor.ggml_type)
            at, was = cut_header.data_offset + tensor.offset, full_header.data_offset + kept.offset
            assert cut_header.view[at : at + size] == full_header.view[was : was + size]
    with pytest.raises(ValueError, match="blocks"):
        write_truncated(default_model_path(), tmp_path / "all.gguf", full.block_count)
