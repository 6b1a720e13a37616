"""Safe-mode records blame a model only under the load settings that crashed: keyed by them,
expired when they change, cleared from the engine client and `stoke doctor --reset-safe-mode`,
listed in words by the doctor's report (issue 33)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app import doctor, paths
from app.engine import safe_mode
from app.engine.host import EngineClient
from app.engine.protocol import LoadOptions
from app.engine.safe_mode import SafeModeRecords

REPO = Path(__file__).resolve().parents[2]


def _model(folder: Path, name: str = "model.gguf") -> str:
    path = folder / name
    path.write_bytes(b"GGUF" + bytes(60))  # the records key a file by path, size and mtime
    return str(path)


def test_a_record_applies_only_under_the_settings_that_crashed(tmp_path: Path) -> None:
    crashed = LoadOptions(_model(tmp_path), n_ctx=300, n_seq_max=1)
    records = SafeModeRecords()
    records.record("llama.cpp", crashed, "killed by SIGABRT")

    record = records.lookup("llama.cpp", crashed)
    assert record is not None and record["settings"]["n_ctx"] == 300
    assert records.lookup("mlx", crashed) is None  # another engine: its own record
    # Settings a crash does not depend on (budgets, template, what to do after a crash) keep it.
    budgets = LoadOptions(crashed.model_path, n_ctx=300, n_seq_max=1, kv_disk_budget=1 << 30)
    assert records.lookup("llama.cpp", budgets) is not None


def test_a_record_expires_when_the_load_settings_change(tmp_path: Path) -> None:
    crashed = LoadOptions(_model(tmp_path), n_ctx=300)
    records = SafeModeRecords()
    records.record("llama.cpp", crashed, "killed by SIGABRT")
    fixed = LoadOptions(crashed.model_path, n_ctx=8192)

    assert records.lookup("llama.cpp", fixed, expire=False) is None  # a report: file untouched
    assert len(records.entries()) == 1
    assert records.lookup("llama.cpp", fixed) is None  # a load: the record is gone
    assert records.entries() == []
    assert records.lookup("llama.cpp", crashed) is None


def test_a_record_from_before_settings_were_kept_has_expired(tmp_path: Path) -> None:
    """Records written before this change name no settings: they blamed the model for any."""
    options = LoadOptions(_model(tmp_path))
    records = SafeModeRecords()
    records.record("llama.cpp", options, "killed by SIGSEGV")
    stored = json.loads(records.path.read_text())
    for record in stored.values():
        del record["settings"], record["path"]
    records.path.write_text(json.dumps(stored))

    assert records.lookup("llama.cpp", options) is None
    assert records.entries() == []


def test_clear_removes_one_models_records_or_all(tmp_path: Path) -> None:
    first, second = LoadOptions(_model(tmp_path, "a.gguf")), LoadOptions(_model(tmp_path, "b.gguf"))
    records = SafeModeRecords()
    for options in (first, second):
        records.record("llama.cpp", options, "killed by SIGSEGV")

    cleared = records.clear(first.model_path)
    assert [r["model"] for r in cleared] == ["a.gguf"]
    assert records.lookup("llama.cpp", first) is None
    assert records.lookup("llama.cpp", second) is not None
    assert [r["model"] for r in records.clear()] == ["b.gguf"] and records.entries() == []


def test_the_words_name_the_model_the_crash_and_the_settings_that_differ(tmp_path: Path) -> None:
    options = LoadOptions(_model(tmp_path), n_ctx=300, n_seq_max=1)
    record = SafeModeRecords().record("llama.cpp", options, "killed by SIGABRT")

    words = safe_mode.words(record)
    assert words.startswith("model.gguf loads on llama.cpp with conservative settings")
    assert "killed by SIGABRT" in words and "n_ctx=300, n_seq_max=1." in words
    assert "\n" not in words and "{" not in words
    plain = SafeModeRecords().record("llama.cpp", LoadOptions(options.model_path), "killed")
    assert safe_mode.words(plain).endswith("with the default load settings.")


def test_the_engine_client_shows_and_clears_its_models_record(tmp_path: Path) -> None:
    """What the window's settings panel uses; no engine process is needed for either."""
    options = LoadOptions(_model(tmp_path), n_ctx=300)
    client = EngineClient(options, backend="llama.cpp")
    assert client.safe_mode() is None
    SafeModeRecords().record("llama.cpp", options, "killed by SIGABRT")

    words = client.safe_mode()
    assert words is not None and "crashed here (killed by SIGABRT" in words
    client.options = LoadOptions(options.model_path, n_ctx=4096)  # Settings changed
    assert client.safe_mode() is None
    client.options = options
    client.clear_safe_mode()
    assert client.safe_mode() is None and SafeModeRecords().entries() == []


def test_doctor_lists_the_records_in_words(tmp_path: Path) -> None:
    options = LoadOptions(_model(tmp_path), n_ctx=300)
    SafeModeRecords().record("llama.cpp", options, "killed by SIGABRT")

    section = doctor.safe_mode()
    (record,) = section["records"]
    assert record["words"] == safe_mode.words(record)
    text = doctor._safe_mode_rows(section)
    assert text[0] == ("model.gguf", record["words"])
    assert "stoke doctor --reset-safe-mode" in text[-1][1]
    assert doctor._safe_mode_rows({"records": []})[0][1].startswith("none")


def test_stoke_doctor_reset_safe_mode_forgets_every_record(
    tmp_path: Path, stoke_home: Path
) -> None:
    for name in ("a.gguf", "b.gguf"):
        SafeModeRecords().record("llama.cpp", LoadOptions(_model(tmp_path, name)), "killed")
    env = {**os.environ, "STOKE_HOME": str(stoke_home)}
    command = [sys.executable, "-m", "app", "doctor", "--reset-safe-mode"]

    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == "Cleared 2 safe-mode records."
    assert sorted(line.split()[0] for line in lines[1:]) == ["a.gguf", "b.gguf"]
    assert SafeModeRecords().entries() == []
    assert (paths.cache_dir() / safe_mode.RECORDS_FILE).stat().st_mode & 0o777 == 0o600

    again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert again.stdout.strip() == "No safe-mode records." and again.stderr == ""
