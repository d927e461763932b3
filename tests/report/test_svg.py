import xml.etree.ElementTree as ET

from pearl.report.svg import Chart, Series, render

NS = "{http://www.w3.org/2000/svg}"


def test_chart_is_valid_svg_with_one_line_per_series_and_escaped_labels():
    chart = Chart("a <b> & c", "t", "y", "gpus")
    chart.series.append(Series("p<1>", [(0, 1.0), (10, 3.0), (5, 2.0)]))
    chart.series.append(Series("budget", [(0, 4.0), (6, 8.0)], step=True, right_axis=True))
    root = ET.fromstring(render(chart))
    lines = root.findall(f"{NS}polyline")
    assert len(lines) == 2
    first = [tuple(map(float, p.split(","))) for p in lines[0].get("points").split()]
    assert [x for x, _ in first] == sorted(x for x, _ in first)  # points drawn in time order
    assert first[0][1] > first[-1][1]  # larger values are higher on the page (smaller y)
    step = lines[1].get("points").split()
    assert len(step) == 4  # each step holds its value until the next change / the end
    texts = [t.text for t in root.iter(f"{NS}text")]
    assert "a <b> & c" in texts and "p<1>" in texts


def test_empty_chart_still_renders():
    root = ET.fromstring(render(Chart("empty", "x", "y")))
    assert root.findall(f"{NS}polyline") == []
