"""The aggregator's dashboard in a real headless browser (Chromium from Debian, driven by
Playwright): a real daemon runs graded episodes of a real task, its events go through a real
nats-server into the aggregator, and the page shows the node, the run, its reward distribution and
tasks, an episode's timeline with the command, its output and the per-test outcomes; it updates
when another episode ends, without a reload (server-sent events). A policy's output is hostile:
markup in a command's output stays text. Screenshots go to test-artifacts/dashboard/.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import TEST_OWNER, events_config, eventually, running_daemon
from rlsandbox.client import AsyncClient, AsyncSession
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.events.aggregator import Aggregator
from rlsandbox.daemon.events.nats_server import NatsServer
from rlsandbox.daemon.grading.task import Task, load_tasks

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent.parent
TASKS = ROOT / "tests" / "fixtures" / "tasks"
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
RUN = "dash-run"
HOSTILE = '<img src=x onerror="window.__owned=1"><script>window.__owned=2</script>'


@pytest.fixture
async def browser() -> AsyncIterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed (Debian package chromium); run scripts/bootstrap.sh", pytrace=False)
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            await b.close()


async def episode(client: AsyncClient, task: Task, *, solve: bool, extra: str = "") -> str:
    async with client.session(task=task, labels={"run": RUN}) as s:
        assert (await s.exec("python3 -c 'print(6 * 7)'")).stdout == b"42\n"
        if extra:
            await s.exec(["printf", "%s", extra])
        if solve:
            await _solve(s)
        result = await s.grade()
        assert result.status == "ok", result.message
        return s.id


async def _solve(s: AsyncSession) -> None:
    src = (await s.read_files(["calc/__init__.py"]))["calc/__init__.py"].data.decode()
    fixed = src.replace("def multiply(a, b):\n    return a + b\n", "def multiply(a, b):\n    return a * b\n")
    assert fixed != src
    await s.write_files({"calc/__init__.py": fixed})


async def test_the_dashboard_shows_a_run_live_in_a_real_browser(
    nats_server: NatsServer, aggregator: Aggregator, tmp_path: Path, images: dict[str, str], browser: object
) -> None:
    from playwright.async_api import Browser, expect

    assert isinstance(browser, Browser)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    task = {t.id: t for t in load_tasks(TASKS)}["py-calc"]
    config = events_config(
        tmp_path,
        nats_server.url,
        node_id=f"{TEST_OWNER}-dash",
        events_include_output=True,
        pools=[PoolConfig(name="python", image="rlsandbox/python-task:latest", min_ready=2, max_total=6)],
    )

    async def graded(n: int) -> bool:
        runs = {r["name"]: r for r in aggregator.store.runs()}
        return (runs.get(RUN) or {}).get("gradings") == n

    async with running_daemon(config) as node, AsyncClient(node.address, timeout=60) as client:
        first = await episode(client, task, solve=True, extra=HOSTILE)
        await eventually(lambda: graded(1), what="the first grading in the aggregator")

        page = await browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        await page.goto(f"http://127.0.0.1:{aggregator.http_port}/")
        await expect(page.locator("#conn")).to_have_text("live", timeout=15_000)
        run_row = page.locator(f'#runs tr[data-run="{RUN}"]')
        await expect(run_row.locator(".gradings")).to_have_text("1", timeout=15_000)
        await expect(run_row.locator(".mean-reward")).to_have_text("1.000")
        await expect(page.locator(f'#nodes tr[data-node="{config.node_id}"] td').nth(1)).to_have_text("live", timeout=15_000)
        # The rate is the page's own computation from the stream: give it its first update (a fresh
        # CI run read it at 0.00 once, right after the node turned live).
        await expect(page.locator("#rate-steps")).not_to_have_text("0.00", timeout=15_000)
        assert float(await page.locator("#rate-steps").text_content() or "0") > 0  # commands in the last minute

        await run_row.click()
        await expect(page.locator("#run")).to_be_visible()
        await expect(page.locator('#dist .bar[data-bucket="1"] .n')).to_have_text("1")
        await expect(page.locator('#tasks tr[data-task="py-calc"] td').nth(1)).to_have_text("1")
        await expect(page.locator("#curve-chart .uplot")).to_have_count(1)
        await page.locator('#tasks tr[data-task="py-calc"]').click()  # that task's curve
        await expect(page.locator("#curve-what")).to_contain_text("task py-calc")
        await page.screenshot(path=str(ARTIFACTS / "1-run.png"), full_page=True)

        await page.locator(f'#sessions tr[data-session="{first}"]').click()
        timeline = page.locator("#timeline")
        await expect(timeline.locator(".ev-step .cmd").first).to_have_text("$ python3 -c 'print(6 * 7)'")
        await expect(timeline.locator(".ev-step .stdout").first).to_have_text("42\n")
        tests = timeline.locator(".ev-reward .tests tr")
        assert await tests.count() >= 5
        multiply = timeline.locator('.ev-reward tr[data-test="tests/test_multiply.py::test_multiply"] td')
        await expect(multiply.nth(1)).to_have_text("passed")
        # The policy's markup is shown as text and never runs.
        await expect(timeline.locator(".ev-step .stdout").nth(1)).to_have_text(HOSTILE)
        assert await page.evaluate("window.__owned") is None
        await page.screenshot(path=str(ARTIFACTS / "2-episode.png"), full_page=True)

        # Another episode ends: the open page updates by itself (server-sent events, no reload).
        second = await episode(client, task, solve=False)
        await expect(run_row.locator(".gradings")).to_have_text("2", timeout=20_000)
        await expect(run_row.locator(".mean-reward")).to_have_text("0.500")
        await expect(page.locator(f'#sessions tr[data-session="{second}"] .reward')).to_have_text("0.000", timeout=20_000)
        await expect(page.locator('#dist .bar[data-bucket="0"] .n')).to_have_text("1")
        await page.screenshot(path=str(ARTIFACTS / "3-updated.png"), full_page=True)
        assert not errors, errors
        await page.close()
