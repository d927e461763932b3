"""``report.html``: one self-contained page per run folder.

The page carries the run's config, its tables and its figures (PNG, embedded as data
URIs, so the file opens anywhere on its own) and links to the run's JSONL files, which
stay beside it. Tables are the Markdown pipe tables the run also writes to ``table.md``.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 2em auto;
       max-width: 1100px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.8em; }
.meta { color: #555; font-size: 0.9em; } .warn { color: #a33; }
"""


@dataclass(slots=True)
class Section:
    heading: str
    text: str = ""  # a plain paragraph
    tables: list[str] = field(default_factory=list)  # Markdown pipe tables
    figures: list[tuple[Path, str]] = field(default_factory=list)  # (PNG path, caption)


def markdown_table(text: str) -> str:
    """A Markdown pipe table (header, rule, rows) as an HTML table; numbers right-aligned."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2:
        return f"<pre>{escape(text)}</pre>"

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip("|").split("|")]

    head = "".join(f"<th>{escape(c)}</th>" for c in cells(lines[0]))
    body = []
    for line in lines[2:]:
        row = "".join(
            f'<td class="num">{escape(c)}</td>' if _numeric(c) else f"<td>{escape(c)}</td>"
            for c in cells(line)
        )
        body.append(f"<tr>{row}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _numeric(cell: str) -> bool:
    return cell.rstrip("x%").lstrip("+-").replace(",", "").replace(".", "", 1).isdigit()


def _figure(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    svg = path.with_suffix(".svg")
    link = f' (<a href="{escape(svg.name)}">SVG</a>)' if svg.exists() else ""
    return (
        f'<figure><img alt="{escape(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{escape(caption)}{link}</figcaption></figure>"
    )


def write_report(
    folder: Path,
    title: str,
    summary: str,
    sections: list[Section],
    warnings: list[str] | None = None,
) -> Path:
    """Write ``folder/report.html``: title, summary line, warnings, the sections, the run's
    files and its config (``config.yaml`` inlined)."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="meta">{escape(summary)} Written {time.strftime("%Y-%m-%d %H:%M:%S")}.</p>',
    ]
    for w in warnings or []:
        parts.append(f'<p class="warn">warning: {escape(w)}</p>')
    for s in sections:
        parts.append(f"<h2>{escape(s.heading)}</h2>")
        if s.text:
            parts.append(f"<p>{escape(s.text)}</p>")
        parts += [markdown_table(t) for t in s.tables]
        parts += [_figure(p, c) for p, c in s.figures]
    files = sorted(p.name for p in folder.iterdir() if p.suffix in (".jsonl", ".json", ".md"))
    if (folder / "runs").is_dir():
        files.append("runs/")
    parts.append("<h2>Files of this run</h2><ul>")
    parts += [f'<li><a href="{escape(name)}">{escape(name)}</a></li>' for name in files]
    parts.append("</ul>")
    config = folder / "config.yaml"
    if config.exists():
        parts.append(f"<h2>Config</h2><pre>{escape(config.read_text())}</pre>")
    parts.append("</body></html>")
    out = folder / "report.html"
    out.write_text("\n".join(parts) + "\n")
    return out
