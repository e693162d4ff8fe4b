"""`sweep report --html` opened in a real headless browser (Debian's chromium, driven over the DevTools
protocol): the explanation and one heatmap per failure mode are visible, a heatmap cell opens its
drill-down, and the page makes no network request. Also the terminal table and PNG heatmap order."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from reportruns import TOKEN, TOKEN_AXIS
from typer.testing import CliRunner

from sweeper.cli import app
from sweeper.reports import bug as bugreport
from sweeper.reports import html as html_report
from sweeper.reports import tables as report
from sweeper.store import frames as analysis
from sweeper.store.run_folder import RunDir

# The shared runs, made once per session (a plugin: fixtures imported per module would run per module).
pytest_plugins = ["reportruns"]

BROWSER = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)
try:
    import aiohttp
except ImportError:  # pragma: no cover - aiohttp comes with ray[default]
    aiohttp = None  # type: ignore[assignment]

needs_browser = pytest.mark.skipif(BROWSER is None or aiohttp is None,
                                   reason="needs Debian's chromium (apt-get install chromium) and aiohttp")


class Browser:
    """Headless chromium over the DevTools protocol: one page, its network requests recorded."""

    def __init__(self, profile: Path) -> None:
        assert BROWSER is not None
        # Chromium makes its scratch folders (org.chromium.Chromium.*) in TMPDIR and leaves them; a
        # socket goes there too, so the folder's path is short (a Unix socket's is 107 bytes at most).
        self.scratch = tempfile.mkdtemp(prefix="sweep-chromium-")
        self.proc = subprocess.Popen(
            [BROWSER, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1400,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "TMPDIR": self.scratch})
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        port, path = port_file.read_text().split()[:2]
        self.url = f"ws://127.0.0.1:{port}{path}"

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def visit(self, url: str, script: str, screenshot: Path, click: str | None = None) -> dict[str, Any]:
        return asyncio.run(self._visit(url, script, screenshot, click))

    async def _visit(self, url: str, script: str, screenshot: Path, click: str | None) -> dict[str, Any]:
        requests: list[str] = []
        async with aiohttp.ClientSession() as http, http.ws_connect(self.url, max_msg_size=0) as ws:
            ids = iter(range(1, 10**6))
            events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
            waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}

            async def reader() -> None:
                async for msg in ws:
                    data = json.loads(msg.data)
                    if "id" in data and data["id"] in waiting:
                        waiting.pop(data["id"]).set_result(data)
                    elif data.get("method") == "Network.requestWillBeSent":
                        requests.append(data["params"]["request"]["url"])
                    elif "method" in data:
                        await events.put(data)

            async def call(method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
                i = next(ids)
                waiting[i] = asyncio.get_running_loop().create_future()
                msg: dict[str, Any] = {"id": i, "method": method, "params": params or {}}
                if session:
                    msg["sessionId"] = session
                await ws.send_str(json.dumps(msg))
                reply = await asyncio.wait_for(waiting[i], 60)
                assert "error" not in reply, reply
                return reply["result"]

            async def loaded() -> None:
                while (await events.get()).get("method") != "Page.loadEventFired":
                    pass

            task = asyncio.create_task(reader())
            target = (await call("Target.createTarget", {"url": "about:blank"}))["targetId"]
            sid = (await call("Target.attachToTarget", {"targetId": target, "flatten": True}))["sessionId"]
            for domain in ("Network", "Page", "Runtime"):
                await call(f"{domain}.enable", session=sid)
            await call("Page.navigate", {"url": url}, session=sid)
            await asyncio.wait_for(loaded(), 60)
            if click:
                await call("Runtime.evaluate", {"expression": click}, session=sid)
                await asyncio.sleep(0.3)
            result = await call("Runtime.evaluate", {"expression": script, "returnByValue": True}, session=sid)
            shot = await call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=sid)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            task.cancel()
        out: dict[str, Any] = result["result"]["value"]
        out["requests"] = requests
        return out


CHECK = """(() => {
  const visible = el => { const r = el.getBoundingClientRect(); const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
  const expl = document.getElementById('explanation');
  const maps = [...document.querySelectorAll('svg.heatmap')].filter(visible);
  return {explanation: expl && visible(expl) ? expl.innerText : '',
          heatmaps: maps.map(m => m.dataset.mode),
          rects: maps.map(m => m.querySelectorAll('rect[data-cell]').length),
          rows: maps.length ? [...maps[0].querySelectorAll('text.row')].map(
            t => [...t.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('')) : [],
          opened: [...document.querySelectorAll('details.cell[open]')].map(d => d.id),
          text: document.body.innerText};
})()"""
CLICK = """(() => { const a = document.querySelector('svg.heatmap[data-mode="mode-3"] rect[fill="#67000d"]').parentNode;
  a.dispatchEvent(new MouseEvent('click', {bubbles: true, cancelable: true, view: window}));
  return a.getAttribute('href'); })()"""


@needs_browser
def test_html_report_in_a_real_browser(demo_run: RunDir, tmp_path: Path) -> None:
    page = tmp_path / "demo.html"
    result = CliRunner().invoke(app, ["report", "demo", "--runs-dir", str(demo_run.root.parent), "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert f"html: {page}" in result.output
    explanation = report.explain_run(demo_run)
    browser = Browser(tmp_path / "profile")
    try:
        got = browser.visit(page.as_uri(), CHECK, tmp_path / "demo.png", click=CLICK)
    finally:
        browser.close()
    # The explanation, with the demo's thinking-budget conjunction, is on screen.
    assert "spec_method=mtp ∧ VLLM_USE_V2_MODEL_RUNNER=1" in got["explanation"]
    assert "neither alone fails" in got["explanation"]
    # One heatmap per failure mode (and one of every failure), 48 cells each, commits in history order.
    assert got["heatmaps"] == [f"mode-{i}" for i in range(1, len(explanation.modes) + 1)] + ["all"]
    assert len(explanation.modes) == 3 and set(got["rects"]) == {48}
    assert got["rows"] == ["v0.27.0", "v0.28.0~3", "v0.28.0", "main"]
    # Clicking the failing heatmap cell opened its drill-down (the page's own script).
    assert len(got["opened"]) == 1 and got["opened"][0].startswith("cell-main-mtp4-")
    assert "Failing responses" in got["text"] and "server log lines of this request" in got["text"]
    # Nothing but the file itself was requested.
    assert got["requests"] and all(u == page.as_uri() or u.startswith(("data:", "about:")) for u in got["requests"])
    shot = Image.open(tmp_path / "demo.png")
    assert shot.size[0] >= 1000 and shot.size[1] > 2000


def test_html_is_self_contained_and_keeps_secrets(secret_run: RunDir, tmp_path: Path) -> None:
    text = html_report.write(secret_run, tmp_path / "s.html").read_text()
    assert TOKEN not in text and TOKEN_AXIS not in text and "&lt;redacted&gt;" in text
    # No reference to anything outside the file.
    for needle in ("http://", "https://", "src=", "<link", "@import", "url("):
        assert needle not in text.replace('xmlns="http://www.w3.org/2000/svg"', ""), needle
    assert "Content-Security-Policy" in text and "default-src 'none'" in text


@needs_browser
def test_a_bisect_run_shows_its_changes_and_probes(ray_cluster: None, demo_run: RunDir, tmp_path: Path) -> None:
    from sweeper.drivers import bisect as driver

    scope = driver.BisectScope(good="v0.28.0", bad="main",
                               matrix_path=Path(__file__).parent.parent / "matrices" / "demo.yaml",
                               where=("spec_method=mtp", "num_speculative_tokens=4", "env.VLLM_USE_V2_MODEL_RUNNER=1",
                                      "request.temperature=0"))
    outcome = driver.run_bisect(scope, driver.BisectOptions(runs_dir=demo_run.root.parent,
                                                            run_id=f"bisect-{tmp_path.name}"[:60],
                                                            cache_dir=demo_run.root.parent.parent / "cache"))
    page = html_report.write(outcome.run, tmp_path / "b.html")
    browser = Browser(tmp_path / "profile")
    script = """(() => ({changes: [...document.querySelectorAll('.change')].map(c => c.innerText),
        probes: document.querySelectorAll('svg.timeline circle.probe').length,
        ranges: document.querySelectorAll('svg.range').length}))()"""
    try:
        got = browser.visit(page.as_uri(), script, tmp_path / "b.png")
    finally:
        browser.close()
    assert any("regression" in c and "Model Runner V2" in c for c in got["changes"]), got["changes"]
    assert got["ranges"] == len(got["changes"]) >= 1
    probes = analysis.load_table(outcome.run, "probes").num_rows
    assert got["probes"] == probes > 0
    assert all(u.startswith(("file:", "data:", "about:")) for u in got["requests"])
    # The bug report of the sweep run now names the culprit this bisect found.
    md = bugreport.issue_markdown(demo_run, mode="reasoning_tokens", runs_dir=demo_run.root.parent)
    culprit = md.split("**Culprit** (found by `sweep bisect`):\n")[1].splitlines()[0]
    assert "[Model Runner V2] Fused multi-step draft decode for MTP (#54120)" in culprit
    assert f"bisect run `{outcome.run.run_id}`" in culprit


def test_terminal_table_and_png_heatmap_in_history_order(demo_run: RunDir, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", "demo", "--runs-dir", str(demo_run.root.parent), "--heatmap",
                                      str(tmp_path / "h.png"), "--rows", "commit", "--cols",
                                      "spec_method,env.VLLM_USE_V2_MODEL_RUNNER"])
    assert result.exit_code == 0, result.output
    assert result.output == f"heatmap: {tmp_path / 'h.png'}\n"  # the heatmap alone, no table first
    result = CliRunner().invoke(app, ["report", "demo", "--runs-dir", str(demo_run.root.parent)])
    lines = result.output.splitlines()
    body = lines[next(i for i, line in enumerate(lines) if "━" in line) + 1:]
    rows = [[p.strip() for p in line.split("│")] for line in body if "│" in line and line.split("│")[0].strip()]
    failing = [r for r in rows if r[4] != "ok" or not r[5].startswith("0/")]
    assert rows[:len(failing)] == failing  # failing cells first, then the others; each in history order
    history = ["v0.27.0", "v0.28.0~3", "v0.28.0", "main"]
    for block in (failing, rows[len(failing):]):
        assert [r[0] for r in block] == sorted((r[0] for r in block), key=history.index)
    assert [c for c in dict.fromkeys(r[0] for r in rows[len(failing):])] == history
    samples = analysis.load_samples(demo_run)
    order = report.commit_order(demo_run)
    pivot = report.failure_pivot(samples, ["commit"], ["spec_method"], commit_order=order)
    assert list(pivot.index) == ["v0.27.0", "v0.28.0~3", "v0.28.0", "main"]
    # Long labels (full shas, every axis) are drawn whole: nothing touches the image border.
    path = report.heatmap(samples[samples.commit == "main"], ["commit_sha"],
                          ["spec_method", "env.VLLM_USE_V2_MODEL_RUNNER", "cell_id"], tmp_path / "long.png",
                          commit_order=order)
    pixels = np.asarray(Image.open(path).convert("L"))
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    assert border.min() > 240, "a label is cut at the image border"
