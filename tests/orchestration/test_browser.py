"""The Airflow UI in a real browser: headless Chromium (Debian's ``chromium`` package)
driven by Playwright, against the stack ``bin/airflow-ui`` runs, over DAG runs that
``bin/demo`` made: the user's two commands, in a fresh home.

``bin/demo`` runs the reachability DAG (its circuit has a loop) for three epochs, then
``bin/airflow-ui`` serves that home. The browser logs in through the login form, opens
every example DAG's Graph view until its tasks are drawn, opens the dbspark page from
the navigation and finds there what the demo printed (each epoch's interval, DAG run and
rows changed; each epoch's loop iterations), and follows a link to a DAG run into
Airflow's own run page. A browser without a login is refused the page's API and is sent
to the login form, which brings it back to the page. Screenshots of every step go to
``var/ui-screenshots/``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import Browser, BrowserContext, Locator, Page, expect, sync_playwright

from dbspark.devtools.airflow import DEFAULT_PASSWORD, DEFAULT_USER, AirflowApiError, RestClient
from dbspark.devtools.demo import interval
from dbspark.devtools.processes import free_port, launch, stop_group, tail, wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "var" / "ui-screenshots"
CHROMIUM = "/usr/bin/chromium"
# The browser talks to the stack only: none of Chromium's own traffic (component updates,
# sync, field trials, QUIC), which a closed network such as CI's refuses.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}
#: Tall enough for the dbspark page's screenshot to hold the epochs and the loop's plot.
TALL_VIEWPORT = {"width": 1280, "height": 1100}
#: The demo's DAG whose runs the page must show: its circuit has a loop.
DEMO_DAG = "dbspark_reachability"
DEMO_EPOCHS = 3
#: Every DAG in dags/ and tasks (or task groups) its Graph view must draw.
GRAPH_NODES = {
    "dbspark_orders_by_region": ("open_epoch", "ingest", "publish", "close_epoch"),
    "dbspark_reachability": ("open_epoch", "loop_reach", "publish", "close_epoch"),
    "dbspark_orders_sql": ("open_epoch", "ingest", "publish", "close_epoch"),
    "dbspark_reachable_sql": ("open_epoch", "loop_reachable_r", "publish", "close_epoch"),
    "region_totals_report": ("report",),
}
UI_STARTUP_TIMEOUT = 240.0
DAG_PARSE_TIMEOUT = 180.0


@dataclass(frozen=True)
class DemoEpoch:
    """One epoch as ``bin/demo`` reported it."""

    run_id: str
    loop_deltas: tuple[int, ...]
    rows_changed: int


@dataclass(frozen=True)
class Stack:
    """The UI's address, and the epochs the demo ran into the home it serves."""

    url: str
    epochs: tuple[DemoEpoch, ...]


def _without_airflow_settings() -> dict[str, str]:
    # The test run's own Airflow home (tests/conftest.py) must not leak into the commands.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["PYSPARK_PYTHON"] = sys.executable
    return env


def parse_demo_output(out: str) -> tuple[DemoEpoch, ...]:
    """Each epoch's DAG run id, loop deltas and rows changed, from the demo's account."""
    epochs = []
    for section in re.split(r"\nepoch \d+ = data interval ", out)[1:]:
        run = re.search(r"DAG run (\S+): success", section)
        loop = re.search(r"loop reach: \d+ iterations, delta rows ([\d, ]+)", section)
        view = re.search(r"view reach: \d+ rows \(change \+(\d+) -(\d+)\)", section)
        assert run and loop and view, f"the demo's account changed:\n{section}"
        epochs.append(
            DemoEpoch(
                run_id=run.group(1),
                loop_deltas=tuple(int(n) for n in loop.group(1).split(", ")),
                rows_changed=int(view.group(1)) + int(view.group(2)),
            )
        )
    return tuple(epochs)


def run_demo(home: Path) -> tuple[DemoEpoch, ...]:
    done = subprocess.run(
        [
            str(REPO / "bin" / "demo"),
            "--home",
            str(home),
            "--dag",
            DEMO_DAG,
            "--epochs",
            str(DEMO_EPOCHS),
        ],
        capture_output=True,
        text=True,
        env=_without_airflow_settings(),
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    epochs = parse_demo_output(done.stdout)
    assert len(epochs) == DEMO_EPOCHS, done.stdout[-3000:]
    return epochs


def wait_for_dags(api: RestClient, dag_ids: list[str], ui: subprocess.Popen[bytes]) -> None:
    """Until the DAG processor has stored every DAG of dags/ (a Graph view needs it)."""
    missing = list(dag_ids)

    def parsed() -> bool:
        assert ui.poll() is None, "bin/airflow-ui exited"
        errors = api.import_errors()
        assert not errors, f"dags/ does not import: {errors}"
        for dag_id in list(missing):
            try:
                api.dag(dag_id)
            except AirflowApiError as err:
                if err.status != 404:
                    raise
            else:
                missing.remove(dag_id)
        return not missing

    assert wait_until(parsed, DAG_PARSE_TIMEOUT, interval=1.0), f"DAGs {missing} never appeared"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """``bin/demo`` then ``bin/airflow-ui`` on one fresh home, as a person runs them."""
    home = tmp_path_factory.mktemp("browser") / "airflow"
    epochs = run_demo(home)
    port = free_port()
    log = home.parent / "airflow-ui.log"
    ui = launch(
        [str(REPO / "bin" / "airflow-ui"), "--home", str(home)],
        log_path=log,
        env={**_without_airflow_settings(), "DBSPARK_UI_PORT": str(port)},
        cwd=REPO,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert ui.poll() is None, f"bin/airflow-ui exited:\n{tail(log)}"
            return f"Airflow UI: {url}" in tail(log)

        assert wait_until(ready, UI_STARTUP_TIMEOUT, interval=0.5), (
            f"bin/airflow-ui was not ready within {UI_STARTUP_TIMEOUT:g}s:\n{tail(log)}"
        )
        wait_for_dags(RestClient(url, DEFAULT_USER, DEFAULT_PASSWORD), list(GRAPH_NODES), ui)
        yield Stack(url=url, epochs=epochs)
    finally:
        # SIGTERM: bin/airflow-ui stops its components and their tasks, then exits.
        stop_group(ui, timeout=60)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"no {CHROMIUM}: install Debian's chromium package (apt-get install chromium; "
            "bin/test does so when run as root)"
        )
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def log_in(page: Page, username: str = DEFAULT_USER, password: str = DEFAULT_PASSWORD) -> None:
    """Fill in and send the login form the page shows."""
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


@pytest.fixture(scope="module")
def logged_in(browser: Browser, stack: Stack) -> Iterator[BrowserContext]:
    """A browser session logged in through the UI's login form."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(60_000)
    page = context.new_page()
    with screenshot_after(page, "login"):
        page.goto(stack.url + "/")
        # The UI's script finds no session and sends the browser to the login form.
        page.wait_for_url(f"{stack.url}/auth/login?**")
        log_in(page)
        page.wait_for_url(stack.url + "/")
    assert "_token" in {cookie["name"] for cookie in context.cookies()}
    page.close()
    yield context
    context.close()


def column(table: Locator, header: str) -> int:
    """Where the column headed ``header`` is in ``table`` (the page's columns depend on
    the circuit's sources and views)."""
    headers = [text.strip() for text in table.locator("thead th").all_inner_texts()]
    assert header in headers, headers
    return headers.index(header)


@contextlib.contextmanager
def screenshot_after(page: Page, name: str) -> Iterator[None]:
    """Save what the page shows when the block ends, passed or failed: a wait that
    timed out is best understood from what was on screen."""
    try:
        yield
    finally:
        page.screenshot(path=SCREENSHOTS / f"{name}.png")


@pytest.mark.parametrize("dag_id", list(GRAPH_NODES))
def test_the_graph_view_of_every_example_dag_draws_its_tasks(
    logged_in: BrowserContext, stack: Stack, dag_id: str
) -> None:
    page = logged_in.new_page()
    with screenshot_after(page, f"graph-{dag_id}"):
        page.goto(f"{stack.url}/dags/{dag_id}")
        page.get_by_role("button", name="Show Graph").click()
        graph = page.locator(".react-flow")
        for node in GRAPH_NODES[dag_id]:
            drawn = graph.locator(f'.react-flow__node[data-id="{node}"]')
            expect(drawn).to_be_visible()
            expect(drawn).to_contain_text(node)
        loops = [n for n in GRAPH_NODES[dag_id] if n.startswith("loop_")]
        if loops:
            # A loop's iterations are a mapped task inside its group.
            page.get_by_role("button", name="Expand all task groups").click()
            for loop in loops:
                expect(
                    graph.locator(f'.react-flow__node[data-id="{loop}.iterate"]')
                ).to_be_visible()
    page.close()


def test_the_dbspark_page_shows_the_demo_epochs_loops_and_links_to_runs(
    logged_in: BrowserContext, stack: Stack
) -> None:
    page = logged_in.new_page()
    page.set_viewport_size(TALL_VIEWPORT)
    page.goto(stack.url + "/")
    page.get_by_test_id("nav-sidebar").get_by_role("link", name="dbspark", exact=True).click()
    page.wait_for_url(f"{stack.url}/plugin/dbspark")
    # The UI shows the plugin's page in a frame.
    shown = page.frame_locator("iframe")
    with screenshot_after(page, "dbspark-page"):
        shown.get_by_role("link", name="reachability", exact=True).click()
        expect(shown.locator("h1")).to_have_text("circuit reachability")

        epochs = shown.locator("table").first
        changed = column(epochs, "rows changed: reach")
        rows = epochs.locator("tbody tr")
        expect(rows).to_have_count(DEMO_EPOCHS)
        for row, number in zip(rows.all(), reversed(range(DEMO_EPOCHS)), strict=True):
            demo, cells, when = stack.epochs[number], row.locator("td"), interval(number)
            expect(cells.nth(0)).to_have_text(str(number))
            expect(cells.nth(1)).to_have_text(
                f"{when.start:%Y-%m-%d %H:%M} → {when.end:%Y-%m-%d %H:%M}"
            )
            expect(cells.nth(2)).to_have_text("committed")
            expect(cells.nth(changed)).to_have_text(str(demo.rows_changed))
            expect(row.get_by_role("link", name=demo.run_id, exact=True)).to_be_visible()
            expect(row.get_by_role("link", name="loop_reach.iterate", exact=True)).to_be_visible()

        plot = shown.get_by_role("img", name="convergence of loop reach")
        expect(plot.locator("polyline")).to_have_count(DEMO_EPOCHS)
        loop = shown.locator("h3", has_text="loop reach").locator(
            "xpath=following-sibling::table[1]"
        )
        rows = loop.locator("tbody tr")
        expect(rows).to_have_count(DEMO_EPOCHS)
        for row, number in zip(rows.all(), reversed(range(DEMO_EPOCHS)), strict=True):
            deltas, cells = stack.epochs[number].loop_deltas, row.locator("td")
            expect(cells.nth(0)).to_have_text(str(number))
            expect(cells.nth(column(loop, "iterations"))).to_have_text(str(len(deltas)))
            expect(cells.nth(column(loop, "delta rows"))).to_have_text(
                " → ".join(str(d) for d in deltas)
            )
            expect(cells.nth(column(loop, "state"))).to_have_text("converged")

    # A link to a run opens Airflow's own run page, in the UI's window (not the frame).
    first_run = stack.epochs[0].run_id
    with screenshot_after(page, "dag-run-page"):
        shown.get_by_role("link", name=first_run, exact=True).click()
        page.wait_for_url(f"{stack.url}/dags/{DEMO_DAG}/runs/{quote(first_run, safe='')}")
        expect(page.get_by_role("heading", name=first_run)).to_be_visible()
        expect(page.get_by_text("Success").first).to_be_visible()
    page.close()


def test_a_browser_without_a_login_is_refused_and_sent_to_the_login(
    browser: Browser, stack: Stack
) -> None:
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(60_000)
    page = context.new_page()
    with screenshot_after(page, "anonymous-api-refused"):
        answer = page.goto(f"{stack.url}/dbspark/api/circuits")
        assert answer is not None and answer.status == 401
        assert "reachability" not in page.content()

    with screenshot_after(page, "anonymous-sent-to-login"):
        page.goto(f"{stack.url}/dbspark/")
        page.wait_for_url(f"{stack.url}/auth/login?next=**")

    # Logged in there, the same browser comes back to the page and is answered.
    with screenshot_after(page, "anonymous-back-after-login"):
        log_in(page)
        page.wait_for_url(f"{stack.url}/dbspark/")
        expect(page.get_by_role("link", name="reachability", exact=True)).to_be_visible()
    answer = page.goto(f"{stack.url}/dbspark/api/circuits")
    assert answer is not None and answer.status == 200
    assert "reachability" in page.content()
    context.close()
