"""Byte counts are written one way: GiB for memory, decimal units for files."""

from __future__ import annotations

from app.units import GIB, decimal_bytes, gib


def test_gib_reads_at_a_glance() -> None:
    assert gib(1.5 * GIB) == "1.50 GiB"
    assert gib(24 * GIB) == "24.0 GiB"
    assert gib(2048 * GIB) == "2,048.0 GiB"
    assert gib(3 * GIB, 2, unit=False) == "3.00"


def test_gib_rounds_a_shortfall_up() -> None:
    thirty_mib = 30 << 20
    assert gib(thirty_mib, 1) == "0.0 GiB"
    assert gib(thirty_mib, 1, up=True) == "0.1 GiB"
    assert gib(GIB, 1, up=True) == "1.0 GiB"


def test_decimal_bytes_as_download_pages_print_them() -> None:
    assert decimal_bytes(999) == "999 bytes"
    assert decimal_bytes(1_500) == "1.5 kB"
    assert decimal_bytes(144_000_000_000) == "144.0 GB"
    assert decimal_bytes(2_000_000_000_000) == "2.0 TB"
