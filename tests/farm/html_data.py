"""Read a farm HTML report back: its embedded data, tables and the ids of its Plotly charts."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class ParsedReport:
    data: dict[str, object]
    charts: list[str]  # ids of the Plotly chart divs, in page order
    tables: dict[str, list[list[str]]] = field(default_factory=dict)  # id -> rows of cell texts


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.script = ""
        self.in_data = False
        self.charts: list[str] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.table: str | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script" and a.get("id") == "farm-data":
            self.in_data = True
        elif tag == "div" and "plotly-graph-div" in (a.get("class") or "").split():
            self.charts.append(a.get("id") or "")
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
    return ParsedReport(json.loads(reader.script), reader.charts, reader.tables)
