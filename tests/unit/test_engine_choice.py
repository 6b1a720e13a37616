"""Which engine runs a model: the platform's pick, the user's choice, and MLX folders.

The platform is described (Apple Silicon or not, MLX installed or not) by patching the two
probes; the model files are real: the bundled GGUF and header-only GGUFs written here.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from app.engine import choice
from app.engine.choice import choose_engine, platform_choice
from app.engine.host import EngineClient
from app.engine.model_file import gguf_architecture
from app.engine.protocol import LoadOptions, RemoteOptions
from app.models.default import default_model_path


def _gguf(path: Path, architecture: str) -> Path:
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_uint32(f"{architecture}.block_count", 2)
    writer.add_array("tokenizer.ggml.scores", [0.5, 0.25])
    writer.add_name("tiny")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path


@pytest.fixture
def mac(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "apple_silicon", lambda: True)
    monkeypatch.setattr(choice, "mlx_installed", lambda: True)


def test_gguf_architecture_reads_the_header_only(tmp_path: Path) -> None:
    assert gguf_architecture(default_model_path()) == "llama"
    assert gguf_architecture(_gguf(tmp_path / "q.gguf", "qwen3")) == "qwen3"
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    assert gguf_architecture(tmp_path / "junk.gguf") is None


def test_apple_silicon_runs_llama_ggufs_on_mlx(mac: None, tmp_path: Path) -> None:
    picked = platform_choice(default_model_path())
    assert picked.engine == "mlx" and "Apple Silicon" in picked.reason
    other = platform_choice(_gguf(tmp_path / "q.gguf", "qwen3"))
    assert other.engine == "llama.cpp" and "MLX does not run qwen3" in other.reason


def test_a_vision_model_runs_on_llama_cpp_and_says_why(mac: None, tmp_path: Path) -> None:
    """Images are read by llama.cpp's projector (libmtmd), not Stoke's MLX engine."""
    import shutil

    model = tmp_path / "vision.gguf"
    shutil.copyfile(default_model_path(), model)
    assert platform_choice(model).engine == "mlx"
    (tmp_path / "mmproj-vision-f16.gguf").write_bytes(b"")
    picked = platform_choice(model)
    assert picked.engine == "llama.cpp" and "vision model" in picked.reason


def test_apple_silicon_without_mlx_uses_llama_cpp_metal(
    mac: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(choice, "mlx_installed", lambda: False)
    picked = platform_choice(default_model_path())
    assert picked.engine == "llama.cpp" and "Metal" in picked.reason


def test_elsewhere_llama_cpp_and_folders_always_mlx(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(choice, "apple_silicon", lambda: False)
    assert platform_choice(default_model_path()).engine == "llama.cpp"
    assert platform_choice(tmp_path).engine == "mlx"
    folder = LoadOptions(str(tmp_path), engine="llama.cpp")
    assert choose_engine(folder).engine == "mlx"  # llama.cpp cannot read a folder


def test_the_users_choice_wins_and_a_server_is_remote(mac: None) -> None:
    model = str(default_model_path())
    assert choose_engine(LoadOptions(model, engine="llama.cpp")).engine == "llama.cpp"
    assert choose_engine(LoadOptions(model)).engine == "mlx"
    served = LoadOptions(model, remote=RemoteOptions(url="http://127.0.0.1:1"))
    assert choose_engine(served).engine == "remote"


def test_the_client_follows_its_options(mac: None) -> None:
    """A model switch replaces the options; the child then starts on their engine."""
    client = EngineClient(LoadOptions(str(default_model_path())))
    assert client.backend == "mlx"
    client.options = LoadOptions(str(default_model_path()), engine="llama.cpp")
    assert client.backend == "llama.cpp"
    assert EngineClient(client.options, backend="mlx").backend == "mlx"
