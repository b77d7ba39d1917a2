"""Read a farm HTML report back: its embedded data, tables and chart images."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from html.parser import HTMLParser

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass
class ParsedReport:
    data: dict[str, object]
    images: dict[str, bytes]  # id -> decoded image bytes
    tables: dict[str, list[list[str]]] = field(default_factory=dict)  # id -> rows of cell texts


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.script = ""
        self.in_data = False
        self.images: dict[str, bytes] = {}
        self.tables: dict[str, list[list[str]]] = {}
        self.table: str | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script" and a.get("id") == "farm-data":
            self.in_data = True
        elif tag == "img":
            src = a.get("src") or ""
            prefix = "data:image/png;base64,"
            if src.startswith(prefix):
                self.images[a.get("id") or ""] = base64.b64decode(src[len(prefix) :])
        elif tag == "table":
            self.table = a.get("id") or ""
            self.tables[self.table] = []
        elif tag == "tr" and self.table is not None:
            self.tables[self.table].append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self.in_data = False
        elif tag == "table":
            self.table = None
        elif tag in ("td", "th") and self.cell is not None and self.table is not None:
            self.tables[self.table][-1].append("".join(self.cell))
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.in_data:
            self.script += data
        elif self.cell is not None:
            self.cell.append(data)


def parse_report(text: str) -> ParsedReport:
    reader = _Reader()
    reader.feed(text)
    return ParsedReport(json.loads(reader.script), reader.images, reader.tables)
