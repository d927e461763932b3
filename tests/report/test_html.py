import shutil
import subprocess
from pathlib import Path

import pytest
from reportparse import parse_report

from pearl.report.html import Section, markdown_table, write_report


def _png(folder: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 2])
    path = folder / "f.png"
    fig.savefig(path)
    fig.savefig(path.with_suffix(".svg"))
    plt.close(fig)
    return path


def test_markdown_tables_become_html_with_numbers_right_aligned_and_text_escaped():
    html = markdown_table("| policy | tok/s |\n|---|---:|\n| a<b> | 1,234.5 |\n| c | +3.25% |")
    assert "<th>policy</th>" in html and "<td>a&lt;b&gt;</td>" in html
    assert '<td class="num">1,234.5</td>' in html and '<td class="num">+3.25%</td>' in html


def test_report_is_self_contained_and_links_the_run_files(tmp_path):
    (tmp_path / "config.yaml").write_text("kind: rl  # <x>\n")
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    figure = _png(tmp_path)
    out = write_report(
        tmp_path,
        "a run",
        "2 runs.",
        [Section("Throughput", "text", ["| p | v |\n|---|---|\n| x | 1 |"], [(figure, "cap")])],
        ["trace ends early"],
    )
    page = parse_report(out)
    assert page.tables == [[["p", "v"], ["x", "1"]]]
    assert page.images == [figure.read_bytes()]
    assert "metrics.jsonl" in page.links and "f.svg" in page.links
    assert "kind: rl  # <x>" in page.text and "warning: trace ends early" in page.text


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium not installed")
def test_the_screenshot_script_renders_a_report_in_headless_chromium(tmp_path):
    (tmp_path / "config.yaml").write_text("kind: rl\n")
    figure = _png(tmp_path)
    report = write_report(tmp_path, "a run", "1 run.", [Section("S", figures=[(figure, "c")])])
    script = Path(__file__).resolve().parents[2] / "scripts" / "screenshot_report.sh"
    out = tmp_path / "shot.png"
    done = subprocess.run(
        ["bash", str(script), str(report), str(out), "800", "600"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_the_screenshot_script_says_what_is_missing(tmp_path):
    script = Path(__file__).resolve().parents[2] / "scripts" / "screenshot_report.sh"
    done = subprocess.run(
        ["bash", str(script), str(tmp_path / "nope.html")], capture_output=True, text=True
    )
    assert done.returncode == 2 and "no report at" in done.stderr
