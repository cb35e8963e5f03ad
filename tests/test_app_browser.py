"""Smoke test in a real browser: `streamlit run` the explorer on a free loopback port, drive Debian's
chromium through playwright, run a small comparison and find the rendered plotly chart."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.launch import app_environment, streamlit_command

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, server: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"streamlit exited with status {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"streamlit did not answer at {url} within {timeout_s:g} s")


@pytest.fixture
def server_url() -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(
        streamlit_command(port), env=app_environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_a_comparison_renders_plotly_charts_in_chromium(server_url: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.goto(server_url, wait_until="domcontentloaded")
            run = page.get_by_role("button", name="Run comparison")
            run.wait_for(timeout=30_000)
            for label, value in (("Requests per point", "40"), ("points", "2")):
                box = page.get_by_label(label, exact=True)
                box.fill(value)
                box.press("Enter")
            page.get_by_role("textbox", name="Layouts to compare").fill("colocated, 3P5C")
            run.click()
            chart = page.locator(".js-plotly-plot").first
            chart.wait_for(state="visible", timeout=60_000)
            # plotly has drawn the traces: one line per layout and statistic, plus the knees
            page.locator(".js-plotly-plot .scatterlayer .trace").first.wait_for(timeout=30_000)
            assert page.locator(".js-plotly-plot").count() >= 2
            assert page.get_by_text("End-to-end latency against load").count() >= 1
            assert page.get_by_text("3P5C knee").count() >= 1 and page.get_by_text("5P3D knee").count() == 0
            assert page.get_by_text("40 requests per point", exact=False).count() == 1
            assert page.locator('[data-testid="stAlertContentError"]').count() == 0
            assert page.locator('[data-testid="stException"]').count() == 0
        finally:
            browser.close()
