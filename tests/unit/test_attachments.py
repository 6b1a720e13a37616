"""Attachments: what can be attached and its text, in words when not; stored, exported, imported;
and the one rendering rule that puts them into the user's message."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import stat
from pathlib import Path

import pytest

from app.conversations import ConversationStore
from app.conversations import attachments as attach
from app.conversations.attachments import (
    Attachment,
    AttachmentError,
    image_attachment,
    read_attachment,
)
from app.conversations.export import ImportFormatError, export_json, export_markdown, import_json
from app.conversations.images import ImageFileError, image_bytes, images_dir
from app.engine.transcript import IMAGE_MARK
from app.session import user_content
from tests.pdfs import write_pdf


def refusal(path: Path) -> str:
    with pytest.raises(AttachmentError) as caught:
        read_attachment(path)
    words = str(caught.value)
    assert path.name in words and "Traceback" not in words and "Error" not in words
    return words


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("notes.txt", "plain words\n"),
        ("readme.md", "# Title\n\n- a list\n"),
        ("table.csv", "city,people\nParis,2100000\n"),
        ("main.py", "def main() -> None:\n    print('hi')\n"),
    ],
)
def test_text_code_markdown_and_csv_files_are_read_as_they_are(
    tmp_path: Path, name: str, body: str
) -> None:
    path = tmp_path / name
    path.write_text(body, "utf-8")
    attachment = read_attachment(path)
    assert attachment == Attachment(name, "text", path.stat().st_size, body)


def test_windows_line_ends_and_a_byte_order_mark_are_normalised(tmp_path: Path) -> None:
    path = tmp_path / "dos.txt"
    path.write_bytes(b"\xef\xbb\xbfone\r\ntwo\rthree\n")
    assert read_attachment(path).text == "one\ntwo\nthree\n"


def test_a_pdf_is_read_page_by_page(tmp_path: Path) -> None:
    path = write_pdf(tmp_path / "report.pdf", [["Quarterly report", "Sales rose"], ["Page two"]])
    attachment = read_attachment(path)
    assert attachment.kind == "pdf" and attachment.name == "report.pdf"
    assert attachment.text == "Quarterly report\nSales rose\n\nPage two"


def test_a_locked_pdf_is_refused_in_words(tmp_path: Path) -> None:
    path = write_pdf(tmp_path / "locked.pdf", [["secret plans"]], password="pw")
    assert "password-protected" in refusal(path)


def test_a_damaged_pdf_and_one_without_text_are_refused_in_words(tmp_path: Path) -> None:
    damaged = tmp_path / "damaged.pdf"
    damaged.write_bytes(b"%PDF-1.7\nthis is not a pdf at all\n")
    assert "damaged" in refusal(damaged) or "no text" in refusal(damaged)
    blank = write_pdf(tmp_path / "scan.pdf", [[]])
    assert "no text layer" in refusal(blank)


def test_binary_foreign_empty_unknown_missing_and_huge_files_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = tmp_path / "image.txt"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    assert "binary" in refusal(binary)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café".encode("latin-1"))
    assert "not UTF-8" in refusal(latin)
    empty = tmp_path / "empty.md"
    empty.write_text("  \n")
    assert "no text" in refusal(empty)
    unknown = tmp_path / "photo.heic"
    unknown.write_bytes(b"\xff\xd8")
    assert "Attach text, code, Markdown, CSV or PDF" in refusal(unknown)
    cut = tmp_path / "photo.jpg"
    cut.write_bytes(b"\xff\xd8")
    assert "photo.jpg is damaged or not an image" in refusal(cut)
    assert "could not read" in refusal(tmp_path / "gone.txt")
    big = tmp_path / "big.txt"
    big.write_text("x" * 2000)
    monkeypatch.setattr(attach, "MAX_FILE_BYTES", 1000)
    assert "at most 1.0 kB" in refusal(big) or "at most 1,000" in refusal(big)


def test_records_round_trip_and_bad_ones_are_refused() -> None:
    attachment = Attachment("a.txt", "text", 3, "abc", 1)
    assert Attachment.from_record(attachment.record()) == attachment
    for bad in ({"name": "a"}, {**attachment.record(), "kind": "exe"}, "text", None):
        with pytest.raises(AttachmentError):
            Attachment.from_record(bad)


def test_the_rendering_rule_puts_files_before_the_words_and_keeps_them_a_prefix() -> None:
    files = [{"name": "a.txt", "text": "alpha"}, {"name": "b.csv", "text": "x,y"}]
    rendered = user_content("What is in them?", files)
    assert rendered == (
        '<file name="a.txt">\nalpha\n</file>\n<file name="b.csv">\nx,y\n</file>\nWhat is in them?'
    )
    assert rendered.startswith(user_content("", files))
    assert user_content("just words") == "just words"


def test_attachments_are_stored_exported_and_imported(tmp_path: Path) -> None:
    records = [Attachment("notes.md", "text", 6, "# Hi\n", 4).record()]
    with ConversationStore.open(tmp_path / "c.db") as store:
        conversation = store.create_conversation()
        user = store.append_user_message(conversation.id, "Summarise", records)
        assert store.get_message(user.id).attachments == records
        # the same message and files again (a turn that never started) is the stored one
        assert store.append_user_message(conversation.id, "Summarise", records).id == user.id
        edit = store.add_message(conversation.id, None, "user", "Other", attachments=records)
        assert store.get_message(edit.id).attachments == records
        store.set_current_leaf(conversation.id, user.id)

        data = json.loads(json.dumps(export_json(store, conversation.id)))
        assert "*Attached: notes.md*" in export_markdown(store, conversation.id)
        imported = import_json(store, data)
        path = store.current_path(imported.id)
        assert [(m.content, m.attachments) for m in path] == [("Summarise", records)]

        data["messages"][0]["attachments"] = [{"name": "x"}]
        with pytest.raises(ImportFormatError, match="Message 1"):
            import_json(store, data)


def _png(colour: tuple[int, int, int], size: tuple[int, int] = (30, 20)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


def test_an_image_is_kept_once_privately_by_its_hash_and_refused_when_changed(
    tmp_path: Path, stoke_home: Path
) -> None:
    data = _png((200, 10, 10))
    path = tmp_path / "red.png"
    path.write_bytes(data)
    record = read_attachment(path).record()
    assert record == {
        "name": "red.png",
        "kind": "image",
        "size": len(data),
        "tokens": None,
        "digest": hashlib.sha256(data).hexdigest(),
        "width": 30,
        "height": 20,
    }
    assert Attachment.from_record(record).record() == record
    # the same picture pasted again is the same file; the folder and file are private
    assert image_attachment("Pasted image.png", data).digest == record["digest"]
    kept = images_dir() / record["digest"]
    assert [p.name for p in images_dir().iterdir() if p.is_file()] == [kept.name]
    assert (images_dir() / "thumbs" / f"{kept.name}.png").is_file()  # made on attach
    assert stat.S_IMODE(images_dir().stat().st_mode) == 0o700
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert image_bytes(record["digest"]) == data
    assert user_content("What is it?", [record]) == IMAGE_MARK + "\nWhat is it?"
    # a mark typed or pasted (a PDF's text holds them) stands for no image: it is left out
    pdf = {"name": "a.pdf", "text": f"x{IMAGE_MARK}y"}
    assert user_content(f"Is{IMAGE_MARK} it?", [record, pdf]).count(IMAGE_MARK) == 1
    assert user_content(f"Is{IMAGE_MARK} it?", [pdf]).count(IMAGE_MARK) == 2  # no image: kept
    kept.write_bytes(_png((0, 0, 0)))
    with pytest.raises(ImageFileError, match="changed on disk"):
        image_bytes(record["digest"])
    for bad in ({**record, "digest": "x"}, {**record, "width": -1}):
        with pytest.raises(AttachmentError):
            Attachment.from_record(bad)


def test_images_travel_inside_an_export_and_a_damaged_one_is_refused(
    tmp_path: Path, stoke_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = image_attachment("garden.png", _png((10, 200, 10))).record()
    with ConversationStore.open(tmp_path / "c.db") as store:
        conversation = store.create_conversation()
        store.append_user_message(conversation.id, "Look", [record])
        data = json.loads(json.dumps(export_json(store, conversation.id)))
    assert data["version"] == 3 and list(data["images"]) == [record["digest"]]

    # another machine: a new home without the picture
    monkeypatch.setenv("STOKE_HOME", str(tmp_path / "elsewhere"))
    with ConversationStore.open() as store:
        damaged = json.loads(json.dumps(data))
        damaged["images"][record["digest"]] = base64.b64encode(b"not it").decode()
        with pytest.raises(ImportFormatError, match=r"picture of garden\.png is damaged"):
            import_json(store, damaged)
        del damaged["images"]
        with pytest.raises(ImportFormatError, match=r"does not hold the picture of garden\.png"):
            import_json(store, damaged)
        imported = import_json(store, data)
        assert store.current_path(imported.id)[0].attachments == [record]
        assert image_bytes(record["digest"]) == _png((10, 200, 10))
