"""Real PDF files for the tests, written with pypdf: text pages (Helvetica), optionally locked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject


def write_pdf(path: Path, pages: Sequence[Sequence[str]], *, password: str | None = None) -> Path:
    """A PDF with one page per item of `pages`, each line of text drawn on its page."""
    writer = PdfWriter()
    font = writer._add_object(
        DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
            }
        )
    )
    for lines in pages:
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
        ops = ["BT", "/F1 12 Tf", "14 TL", "72 720 Td", *(f"({line}) Tj T*" for line in lines)]
        content = DecodedStreamObject()
        content.set_data("\n".join([*ops, "ET"]).encode("latin-1"))
        page[NameObject("/Contents")] = writer._add_object(content)
    if password is not None:
        writer.encrypt(password, algorithm="RC4-128")
    with path.open("wb") as fh:
        writer.write(fh)
    return path
