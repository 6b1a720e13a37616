"""How every benchmark reports: its table for a person, then its report as one JSON line (the
last line of stdout, which tests and scripts read), and the same JSON in a file when asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(report: dict[str, Any], table: str, json_path: str | None) -> int:
    """Print `table` and `report`, write the report to `json_path` when given; exit code 0."""
    print(table)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n", "utf-8")
    print(json.dumps(report))
    return 0
