"""Reads a run folder's ``report.html`` back with the standard library's HTML parser."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path


@dataclass
class Page:
    text: str = ""
    tables: list[list[list[str]]] = field(default_factory=list)  # rows of cells per table
    images: list[bytes] = field(default_factory=list)  # decoded data-URI payloads
    links: list[str] = field(default_factory=list)


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.page = Page()
        self.open_tags: list[str] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag not in ("img", "meta", "br"):
            self.open_tags.append(tag)
        if tag == "table":
            self.page.tables.append([])
        elif tag == "tr":
            self.page.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = []
        elif tag == "img":
            src = a.get("src", "")
            assert src.startswith("data:image/png;base64,"), f"image not embedded: {src[:60]}"
            self.page.images.append(base64.b64decode(src.split(",", 1)[1], validate=True))
        elif tag == "a":
            self.page.links.append(a["href"])

    def handle_endtag(self, tag):
        assert self.open_tags and self.open_tags[-1] == tag, f"unbalanced </{tag}>"
        self.open_tags.pop()
        if tag in ("td", "th"):
            self.page.tables[-1][-1].append("".join(self.cell or []))
            self.cell = None

    def handle_data(self, data):
        self.page.text += data
        if self.cell is not None:
            self.cell.append(data)


def parse_report(path: Path) -> Page:
    """Parse ``report.html``; every tag closed, every image embedded as a PNG, every local
    link pointing at a file of the folder."""
    reader = _Reader()
    reader.feed(path.read_text())
    reader.close()
    assert reader.open_tags == [], f"unclosed tags {reader.open_tags}"
    for image in reader.page.images:
        assert image[:8] == b"\x89PNG\r\n\x1a\n"
    for link in reader.page.links:
        assert (path.parent / link).exists(), f"broken link {link}"
    return reader.page
