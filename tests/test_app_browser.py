"""Real servers: `streamlit run` the explorer on a free loopback port, drive Debian's chromium through
playwright, run a small comparison and find the rendered plotly chart; and `sangam app` stopped by a
signal, idle or in the middle of a sweep, leaves no process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.launch import app_environment, streamlit_command

ROOT = Path(__file__).parents[1]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def is_serving(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def wait_healthy(url: str, server: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"streamlit exited with status {server.returncode}")
        if is_serving(url):
            return
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


@needs_chromium
def test_a_comparison_renders_plotly_charts_in_chromium(server_url: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.goto(server_url, wait_until="domcontentloaded")
            run = page.get_by_role("button", name="Run comparison")
            run.wait_for(timeout=30_000)
            assert page.get_by_label("Mask buffer (tokens)", exact=True).input_value() == "1024"  # ShareGPT's
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


@needs_chromium
def test_the_search_page_ranks_layouts_in_chromium(server_url: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.goto(f"{server_url}/search", wait_until="domcontentloaded")
            run = page.get_by_role("button", name="Find the capacity")
            run.wait_for(timeout=30_000)
            for label, value in (("GPUs", "2"), ("Requests per probe", "40"), ("precision", "0.5")):
                box = page.get_by_label(label, exact=True)
                box.fill(value)
                box.press("Enter")
            page.get_by_role("textbox", name="Layouts").fill("2C, 1C")
            page.get_by_role("textbox", name="SLOs").fill("mean_e2el_s=3")
            run.click()
            page.locator(".js-plotly-plot .barlayer .trace").first.wait_for(timeout=90_000)
            assert page.locator(".js-plotly-plot").count() == 2  # the answers and the probes
            assert page.get_by_text("Best configuration").count() == 1
            assert page.get_by_text("2C τ1024 θ8192").count() >= 1
            assert page.locator('[data-testid="stAlertContentError"]').count() == 0
            assert page.locator('[data-testid="stException"]').count() == 0
        finally:
            browser.close()


# --- `sangam app` and its signals ------------------------------------------------------------------------

Process = tuple[int, str]  # pid and start time (clock ticks since boot): a reused pid is another process


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command (state, ppid, pgrp, ...); None once it is gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def process_tree(pid: int) -> set[Process]:
    """`pid` and every live descendant of it."""
    parents: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append((int(entry.name), fields[19]))
    tree, todo = set(), [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        tree.update(children)
        todo.extend(child for child, _ in children)
    fields = _stat(pid)
    if fields is not None and fields[0] != "Z":
        tree.add((pid, fields[19]))
    return tree


def still_running(processes: set[Process]) -> set[Process]:
    """Those of `processes` that have not exited (a zombie has)."""
    return {(pid, start) for pid, start in processes if (f := _stat(pid)) and f[0] != "Z" and f[19] == start}


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} after {timeout_s:g} s")
        time.sleep(0.1)


@contextlib.contextmanager
def sangam_app(port: int) -> Iterator[tuple[subprocess.Popen[bytes], set[Process]]]:
    """`python -m app.launch --port PORT` (what `sangam app` runs), and the processes seen under it; any
    still running at the end are killed, so that a failing test leaves nothing behind either."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "app.launch", "--port", str(port)],
        cwd=ROOT,
        env=app_environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    seen: set[Process] = set()
    try:
        yield launcher, seen
    finally:
        for pid, _ in still_running(seen | process_tree(launcher.pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        launcher.wait()


def assert_stops_everything(
    launcher: subprocess.Popen[bytes], seen: set[Process], signum: int, url: str
) -> None:
    os.kill(launcher.pid, signum)  # the launcher alone, as `kill PID` or a process manager would
    wait_until(lambda: launcher.poll() is not None, 30, "the launcher is still running")
    left = {(pid, start) for pid, start in seen if pid != launcher.pid}
    wait_until(lambda: not still_running(left), 30, "processes are still running")
    assert not is_serving(url)
    assert launcher.returncode == 128 + signum


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_sangam_app_stops_its_server(signum: int) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with sangam_app(port) as (launcher, seen):
        wait_healthy(url, launcher)
        seen |= process_tree(launcher.pid)
        assert len(seen) >= 2  # the launcher and streamlit
        assert_stops_everything(launcher, seen, signum, url)


@needs_chromium
def test_sigterm_in_the_middle_of_a_sweep_stops_its_worker_processes() -> None:
    from playwright.sync_api import sync_playwright

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with sangam_app(port) as (launcher, seen), sync_playwright() as p:
        wait_healthy(url, launcher)
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.goto(url, wait_until="domcontentloaded")
            run = page.get_by_role("button", name="Run comparison")
            run.wait_for(timeout=30_000)
            box = page.get_by_label("Requests per point", exact=True)
            box.fill("20000")  # 30 points of 20,000 requests: the sweep is still running when stopped
            box.press("Enter")
            run.click()

            def sweeping() -> bool:  # the launcher, streamlit and the sweep's worker processes
                seen.update(process_tree(launcher.pid))
                return len(still_running(seen)) >= 4

            wait_until(sweeping, 60, "the sweep's worker processes have not started")
            assert_stops_everything(launcher, seen, signal.SIGTERM, url)
        finally:
            browser.close()
