"""How the demo writes its files (JSON indented with sorted keys, JSON Lines rows; UTF-8) and fingerprints them
for its stamp (SHA-256). Plain writes: the whole demo folder is built aside and renamed into place."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence


def write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
