"""`sweep report RUN --metrics`: the table per load point, its JSON, the Pareto picture, the metric
heatmap and the HTML section, from a real metrics Parquet file."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd

from sweeper.reports import metrics as report
from tests.metricframes import frame, noisy, row

PNG = b"\x89PNG\r\n\x1a\n"
# (spec method, tokens) -> (output throughput, mean TPOT): mtp k=2 is fastest and cheapest; k=4 trades
# TPOT for throughput (also on the frontier); ngram is beaten by mtp k=2 on both.
CONFIGS = {("none", None): (800.0, 30.0), ("mtp", 2): (1400.0, 18.0), ("mtp", 4): (1600.0, 21.0),
           ("ngram", 2): (1000.0, 25.0)}


def _metrics(tmp_path: Path) -> pd.DataFrame:
    rng = random.Random(7)
    rows = []
    for (spec, k), (tput, tpot) in CONFIGS.items():
        axes = {"commit": "main", "spec_method": spec, **({"num_speculative_tokens": k} if k else {})}
        for s in range(3):
            for point, scale in (("concurrency=1", 0.25), ("concurrency=8", 1.0)):
                rows.append(row(axes, s, point, output_throughput=noisy(rng, tput * scale, 0.01),
                                request_throughput=noisy(rng, tput * scale / 64, 0.01),
                                mean_tpot_ms=noisy(rng, tpot / scale ** 0.2, 0.01), mean_ttft_ms=noisy(rng, 50, 0.02),
                                spec_decode_acceptance_length=2.5 if spec != "none" else None))
    rows.append(row({"commit": "main", "spec_method": "ngram", "num_speculative_tokens": 2}, 3, valid=False,
                    reason="/metrics went backwards", output_throughput=5.0, mean_tpot_ms=999.0))
    return frame(rows, tmp_path / "metrics.parquet")


def test_a_table_per_load_point_within_100_columns(tmp_path: Path) -> None:
    lines = report.table_lines(_metrics(tmp_path))
    assert all(len(line) <= 100 for line in lines)
    assert [line for line in lines if line.startswith("load point")] == ["load point concurrency=1",
                                                                         "load point concurrency=8"]
    assert "every row: commit=main" in lines
    mtp2 = [line for line in lines if line.startswith("mtp k2 ")]
    assert len(mtp2) == 2 and mtp2[1].split()[4].startswith("14")  # out tok/s near 1400 at concurrency 8
    ngram = [line for line in lines if line.startswith("ngram")]
    assert " 3!1 " in ngram[1]  # three valid starts, one invalid left out
    assert any("/metrics went backwards" in line for line in lines)
    assert all("999" not in line for line in lines)  # the invalid start's figure is never shown


def test_json_has_each_metric_with_its_interval(tmp_path: Path) -> None:
    data = json.loads(json.dumps(report.as_json(_metrics(tmp_path))))
    row8 = next(r for r in data["rows"] if r["settings"].get("spec_method") == "mtp"
                and r["settings"].get("num_speculative_tokens") == "4" and r["load_point"] == "concurrency=8")
    tput = row8["metrics"]["output_throughput"]
    assert tput["low"] < 1600 < tput["high"] and row8["starts"] == 3
    assert row8["metrics"]["p99_itl_ms"] is None


def test_the_pareto_frontier_is_the_undominated_configurations(tmp_path: Path) -> None:
    # The last one ties mtp k=2 on TPOT with less throughput: beaten, not on the frontier.
    points = [(30.0, 800.0), (18.0, 1400.0), (21.0, 1600.0), (25.0, 1000.0), (18.0, 1300.0)]
    assert report.frontier(points) == [1, 2]
    path = report.pareto(_metrics(tmp_path), tmp_path / "pareto.png")
    assert path.read_bytes()[:8] == PNG


def test_a_metric_heatmap_over_two_axes(tmp_path: Path) -> None:
    metrics = _metrics(tmp_path)
    table = report.pivot(metrics, ["spec_method"], ["num_speculative_tokens"], "mean_tpot_ms", "concurrency=8")
    assert abs(table.loc["mtp", "2"] - 18.0) < 1.0 and abs(table.loc["none", "·"] - 30.0) < 1.5
    path = report.heatmap(metrics, ["spec_method"], ["num_speculative_tokens"], "mean_tpot_ms", tmp_path / "h.png")
    assert path.read_bytes()[:8] == PNG


def test_the_html_section_holds_the_tables_and_the_picture(tmp_path: Path) -> None:
    section = report.html_section(_metrics(tmp_path))
    assert section.startswith('<section id="metrics">') and "load point concurrency=8" in section
    assert "data:image/png;base64," in section
    assert report.html_section(pd.DataFrame()) == ""
