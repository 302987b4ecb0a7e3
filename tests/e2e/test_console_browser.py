"""The web console in a real browser against a live demo: `crater up` (a real nats-server with
TLS and per-service NATS users, every service its own process, the simulated fleet and its
workload) and headless Chromium driven by Playwright. It signs in with the demo's admin key,
reads the pools, tasks, nodes and autoscaler pages and checks their figures against the REST
API, watches a task it submits appear and end without reloading the page, and takes the
screenshots of docs/console.md (into CRATER_CONSOLE_SCREENSHOTS, docs/console to update them:
`make console-screenshots`)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.parallel import HEAVY_STACK

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.e2e,
    HEAVY_STACK,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's Chromium at /usr/bin/chromium (apt-get install -y chromium)",
    ),
]
playwright_api = pytest.importorskip("playwright.async_api")
Page = Any  # playwright's Page (typed loosely: the module is imported only when present)


@dataclass
class Demo:
    url: str
    token: str

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, timeout=10, headers={"authorization": f"Bearer {self.token}"}
        )


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    """`crater up` (no local node: the simulated fleet only) until the test ends."""
    data_dir = tmp_path / "demo"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "crater.cli",
            "up",
            "--duration",
            "600",
            "--rate",
            "0.5",
            "--no-local",
            "--data-dir",
            str(data_dir),
        ],
        env={**os.environ, "COLUMNS": "250"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    gateway = None
    deadline = time.monotonic() + 120
    for line in process.stdout:
        lines.append(line)
        if found := re.search(r"gateway: (http://127\.0\.0\.1:\d+)", line):
            gateway = found.group(1)
            break
        if time.monotonic() > deadline:
            break
    if gateway is None:
        process.kill()
        pytest.fail("the demo did not start:\n" + "".join(lines[-40:]))
    # keep reading its output, or it blocks on a full pipe
    threading.Thread(
        target=lambda: [lines.append(x) for x in process.stdout or []], daemon=True
    ).start()
    token = (data_dir / "secrets" / "admin-token").read_text().strip()
    try:
        yield Demo(gateway, token)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("CRATER_CONSOLE_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    async with playwright_api.async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        context = await browser.new_context(viewport={"width": 1440, "height": 1000})
        opened = await context.new_page()
        opened.set_default_timeout(30_000)
        # and the assertions' (5 s by default): a page asking the scheduler through the
        # gateway takes seconds on a loaded machine (CI runs this among the other e2e tests)
        playwright_api.expect.set_options(timeout=30_000)
        try:
            yield opened
        finally:
            await browser.close()


async def until(check: Any, seconds: float = 60, every: float = 1.0) -> Any:
    """Ask `check()` again until it returns something truthy; that."""
    deadline = time.monotonic() + seconds
    while True:
        found = await check()
        if found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(every)


async def test_the_console_shows_the_live_demo_and_a_task_changing_live(
    demo: Demo, page: Page, shots: Path
) -> None:
    expect = playwright_api.expect
    async with demo.client() as api:
        nodes = await until(lambda: _nodes_known(api, minimum=20), seconds=90)  # the fleet reported
        assert nodes, "the scheduler never knew the simulated fleet"

        # Signing in: the console sends a browser without a session to its login page.
        await page.goto(f"{demo.url}/console/tasks")
        await expect(page).to_have_url(re.compile(r"/console/login\?next=/console/tasks"))
        await page.screenshot(path=str(shots / "login.png"))
        await page.fill("input[name=api_key]", "crt_wrong")
        await page.click("button[type=submit]")
        await expect(page.locator(".problem")).to_contain_text("not known")
        await page.fill("input[name=api_key]", demo.token)
        await page.click("button[type=submit]")
        await expect(page).to_have_url(re.compile(r"/console/tasks$"))
        await expect(page.locator(".who")).to_contain_text("admin")

        # Pools: the figures are the scheduler's, as the REST API reports its nodes.
        await page.goto(f"{demo.url}/console/pools")
        training = page.locator("article.pool[data-pool=training]")
        await expect(training).to_be_visible()
        gpus = sum(n["gpus_total"] for n in nodes if n["pool"] == "training")
        await expect(training.locator("[data-resource=GPUs] .figure")).to_contain_text(f"/ {gpus}")
        ready = sum(1 for n in nodes if n["pool"] == "training")
        await expect(training.locator(".sub")).to_contain_text(f"/{ready} ready")
        await until(lambda: _text_has(page, "table.quotas", "search"), seconds=60)
        await expect(page.locator("table.quotas")).to_contain_text("search")

        # Tasks: the demo's tasks, each with the scheduler's status; then one of ours, live.
        await page.goto(f"{demo.url}/console/tasks")
        listed = (await api.get("/api/v1/tasks", params={"limit": 5})).json()["tasks"]
        assert listed
        first = listed[-1]
        await expect(page.locator(f"tr[data-task='{first['task_id']}']")).to_be_visible()
        await page.evaluate("window.consoleNotReloaded = true")
        await expect(page.locator("#live.on")).to_be_attached()  # the event stream is open
        body = {
            "task_id": "console-live-1",
            "task_type": "evaluation",
            "model_config": {"name": "bert-base-uncased"},
            "resource_requirements": {"cpu": {"cores": 2}, "memory": {"capacity_mb": 2048}},
            "pool": "default",
            "tenant": "search",
        }
        assert (await api.post("/api/v1/schedule", json=body)).status_code == 202
        row = page.locator("tr[data-task='console-live-1']")
        await expect(row).to_be_visible(timeout=30_000)
        await expect(row).to_have_attribute(
            "data-status", re.compile("scheduled|running"), timeout=30_000
        )
        await expect(row.locator("td.where")).not_to_be_empty()
        await row.locator("a").click()  # its detail: peaks, where, webhooks
        detail = page.locator("#task-detail .task-detail[data-task='console-live-1']")
        await expect(detail).to_contain_text("predicted host memory")
        await expect(detail.locator("table.webhooks")).to_contain_text("scheduled", timeout=30_000)
        # Three tasks for the two 4-GPU A100 PCIe nodes (no demo task asks for them): one
        # waits, and says why, per filter.
        for n in (1, 2, 3):
            hold = {**body, "task_id": f"console-hold-{n}", "task_type": "training"}
            hold["resource_requirements"] = {
                "gpu": {"count": 4, "memory_mb": 16384},
                "cpu": {"cores": 2},
                "memory": {"capacity_mb": 4096},
            }
            hold["node_selector"] = {"crater.ai/profile": "a100-pcie-4"}
            assert (await api.post("/api/v1/schedule", json=hold)).status_code == 202
        await page.fill("input[name=q]", "console-hold")
        waiting = page.locator("tr[data-status=pending]")
        await expect(waiting).to_have_count(1, timeout=30_000)
        await expect(waiting.locator(".why")).to_contain_text("nodes available")
        await waiting.locator("a").click()
        await expect(page.locator("#task-detail table.reasons")).to_contain_text("GPU")
        await page.screenshot(path=str(shots / "task-waiting.png"), full_page=True)
        await page.fill("input[name=q]", "")
        assert (await api.post("/api/v1/tasks/console-live-1/cancel")).status_code == 202
        await expect(row).to_have_attribute("data-status", "cancelled", timeout=30_000)
        assert await page.evaluate("window.consoleNotReloaded === true")  # live, no reload
        await page.screenshot(path=str(shots / "tasks.png"), full_page=True)

        # Nodes: every node the scheduler knows, with its probe's latest metrics.
        await page.goto(f"{demo.url}/console/nodes")
        for node in nodes[:3]:
            await expect(page.locator(f"tr[data-node='{node['node_id']}']")).to_be_visible()
        dgx = next(n["node_id"] for n in nodes if n["gpus_total"] >= 8)
        cpu_cell = page.locator(f"tr[data-node='{dgx}'] td[data-figure=cpu]")
        await expect(cpu_cell).to_contain_text("%", timeout=30_000)
        await page.locator(f"tr[data-node='{dgx}'] a").click()
        shown = page.locator(f"#node-detail .node-detail[data-node='{dgx}']")
        await expect(shown.locator("svg.topology")).to_be_visible()
        await expect(shown.locator("table.checks")).to_contain_text("pass")
        await page.screenshot(path=str(shots / "nodes.png"), full_page=True)
        await page.goto(f"{demo.url}/console/nodes/{dgx}")
        await expect(page.locator("svg.topology .t-gpu")).to_have_count(
            next(n["gpus_total"] for n in nodes if n["node_id"] == dgx)
        )
        await page.screenshot(path=str(shots / "node.png"), full_page=True)

        # Autoscaler: the demo's inference fleet, its figures and (after its burst) decisions.
        await page.goto(f"{demo.url}/console/fleets")
        fleet = page.locator("article.fleet[data-fleet=chat-llama3]")
        await expect(fleet).to_be_visible(timeout=30_000)
        await expect(fleet.locator("[data-figure=p95]")).to_contain_text("ms")
        await expect(fleet.locator("table.decisions")).to_contain_text("out", timeout=90_000)
        await page.screenshot(path=str(shots / "fleets.png"), full_page=True)

        # The pools again, a minute into the demo (the screenshot of docs/console.md).
        await page.goto(f"{demo.url}/console/pools")
        await expect(page.locator("article.pool[data-pool=training]")).to_be_visible()
        await page.screenshot(path=str(shots / "pools.png"), full_page=True)

        # Signing out ends the session: the next page is the login page again.
        await page.click("header form button")
        await expect(page).to_have_url(re.compile(r"/console/login"))
        await page.goto(f"{demo.url}/console/pools")
        await expect(page).to_have_url(re.compile(r"/console/login"))


async def _nodes_known(api: httpx.AsyncClient, minimum: int) -> list[dict[str, Any]] | None:
    response = await api.get("/api/v1/nodes")
    if response.status_code != 200:
        return None
    nodes: list[dict[str, Any]] = response.json()["nodes"]
    return nodes if len(nodes) >= minimum else None


async def _text_has(page: Page, selector: str, text: str) -> bool:
    found = page.locator(selector)
    return bool(await found.count()) and text in (await found.inner_text())
