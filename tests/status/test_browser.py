"""The status page in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by selenium), against a real ``vgpud scheduler``.

The browser is installed with apt-get when missing and we are root; otherwise these
tests skip with the reason, or fail with it when ``VGPUD_BROWSER_REQUIRED=1`` (CI, where
a skip would hide a broken setup).

Screenshots: written to a temporary directory (the path is printed: ``pytest -s``),
and copied to ``$VGPUD_ARTIFACTS/status/`` when that variable names a directory (CI
keeps it as the run's artefacts): ``desktop.png`` (1280 x 800), ``desktop-search.png``
(after typing a search), ``phone.png`` (390 x 844) and ``phone-full.png`` (the whole page
at phone width).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest

from tests.builders import gpu_pod
from tests.debian import unavailable
from tests.e2e.cluster import Driver, Scheduler, free_port, standin
from tests.status.browser import (
    BrowserUnavailable,
    console_errors,
    emulate,
    obtain_browser,
    screenshot,
    start,
)
from tests.status.cluster import EVIL, NODES, PLACED, Placed, placed_cluster_sync

# the first run may apt-get install chromium (~100 MB) inside the first test's setup
pytestmark = pytest.mark.timeout(900)

ROWS = "[...document.querySelectorAll('#gpu-table tbody tr')].map(tr => tr.innerText)"


@pytest.fixture(scope="module")
def browser_paths() -> tuple[str, str]:
    try:
        return obtain_browser()
    except BrowserUnavailable as e:
        unavailable("headless Chromium", "VGPUD_BROWSER_REQUIRED", e)


@pytest.fixture(scope="module")
def cluster(browser_paths: tuple[str, str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Placed]:
    with placed_cluster_sync(tmp_path_factory.mktemp("status-e2e")) as c:
        yield c


@pytest.fixture(scope="module")
def browser(browser_paths: tuple[str, str]) -> Iterator[Any]:
    d = start(*browser_paths)
    try:
        yield d
    finally:
        d.quit()


@pytest.fixture(scope="module")
def keep(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Any, str, bool], Path]:
    """``keep(driver, name, full)``: a screenshot, kept as an artefact."""
    here = tmp_path_factory.mktemp("status-screens")
    there = os.environ.get("VGPUD_ARTIFACTS")

    def keep_(d: Any, name: str, full: bool = False) -> Path:
        path = screenshot(d, here / name, full=full)
        if there:
            out = Path(there) / "status"
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, out / name)
        print(f"screenshot: {path}")
        return path

    return keep_


def wait(d: Any, script: str, *, timeout: float = 10) -> Any:
    """Poll a JS expression until it is truthy; its value."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(d, timeout, poll_frequency=0.05).until(
        lambda d: d.execute_script(f"return ({script});"))


def rows(d: Any) -> list[str]:
    return list(d.execute_script(f"return {ROWS};"))


def api(c: Placed, path: str) -> Any:
    with urllib.request.urlopen(c.sched.ops_url + path, timeout=10) as r:
        return json.load(r)


def no_alert(d: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        _ = d.switch_to.alert.text


def load(d: Any, url: str) -> None:
    d.get(url)
    wait(d, "document.readyState === 'complete' && "
            "document.getElementById('live').textContent.startsWith('auto-refresh')")


def test_desktop_shows_the_placed_pods_and_search_filters_them(
        browser: Any, cluster: Placed, keep: Callable[..., Path]) -> None:
    d = browser
    console_errors(d)  # drain
    emulate(d, 1280, 800)
    load(d, cluster.sched.ops_url + "/")
    got = rows(d)
    assert len(got) == 8  # 2 + 4 + 2 GPUs
    table = "\n".join(got)
    for name, (ns, _, _) in PLACED.items():
        assert f"{ns}/{name}" in table, name
    assert f"default/{EVIL}" in table  # markup shown as text, not run
    no_alert(d)
    assert "unhealthy" in table and "NVIDIA A100-SXM4-80GB" in table
    pending = d.find_element("id", "pending-table").text
    assert "team-c/too-big" in pending and "99999 MiB" in pending
    fcp = d.execute_script("return performance.getEntriesByName('first-contentful-paint')"
                           ".map(e => e.startTime)[0];")
    print(f"first contentful paint: {fcp:.0f} ms")
    keep(d, "desktop.png")

    d.find_element("id", "q").send_keys("train")
    wait(d, "location.search.includes('q=train')")
    got = rows(d)
    assert got and all("train-" in r for r in got), got
    assert len(got) == api(cluster, "/api/v1/gpus?q=train")["total"] >= 2
    keep(d, "desktop-search.png")

    q = d.find_element("id", "q")
    q.clear()
    d.find_element("id", "namespace").send_keys("team-b")
    wait(d, "location.search.includes('namespace=team-b') && !location.search.includes('q=')")
    got = rows(d)
    # GPUs holding a team-b slice (with whoever shares them)
    assert got and all("team-b/" in r for r in got)
    assert len(got) == api(cluster, "/api/v1/gpus?namespace=team-b")["total"] < 8
    d.find_element("id", "namespace").send_keys("-nothing")
    wait(d, "location.search.includes('team-b-nothing')")
    assert rows(d) == [] and d.find_element("id", "gpus-empty").text == "No GPUs match."
    assert d.find_element("id", "pending-empty").is_displayed()
    assert console_errors(d) == []


def test_phone_width_is_cards_that_fit(browser: Any, cluster: Placed,
                                       keep: Callable[..., Path]) -> None:
    d = browser
    console_errors(d)
    emulate(d, 390, 844, mobile=True, scale=2)
    load(d, cluster.sched.ops_url + "/")
    assert d.execute_script("return document.documentElement.scrollWidth;") <= 390
    assert d.execute_script("return getComputedStyle(document.querySelector('#gpu-table thead'))"
                            ".display;") == "none"
    assert d.execute_script("return getComputedStyle(document.querySelector("
                            "'#gpu-table tbody tr')).display;") == "block"
    assert len(rows(d)) == 8
    keep(d, "phone.png")
    keep(d, "phone-full.png", full=True)
    d.find_element("id", "q").send_keys("infer")
    wait(d, "location.search.includes('q=infer')")
    got = rows(d)
    assert len(got) == 1 and "team-b/infer-1" in got[0]
    assert d.execute_script("return document.documentElement.scrollWidth;") <= 390
    assert console_errors(d) == []


async def _schedule_one(api: str, ext: str) -> str:
    async with aiohttp.ClientSession() as s:
        d = Driver(s, api, ext)
        pod = gpu_pod("late-arrival", {"nvidia.com/vgpu-number": 1,
                                       "nvidia.com/vgpu-memory": 3000}, namespace="team-d")
        await d.create([pod])
        got = await d.schedule(pod, NODES)
        assert got.node is not None, got
        return got.node


PARTS = ("summary", "pending-table", "gpu-table", "range")


def drawn_twice(d: Any, url: str) -> dict[str, str]:
    """``url`` as the server drew it, then redrawn by the script from the JSON API: the
    two must be the same, part for part; the server's parts."""
    console_errors(d)
    emulate(d, 1280, 800)
    load(d, url)
    html = (f"return Object.fromEntries({json.dumps(list(PARTS))}.map(id => [id, "
            "document.getElementById(id).innerHTML.replace(/>\\s+</g, '><').trim()]));")
    server: dict[str, str] = d.execute_script(html)
    d.execute_script("document.getElementById('filters').requestSubmit();")
    wait(d, "Number(document.body.dataset.loaded || 0) >= 1")
    script = d.execute_script(html)
    for part in PARTS:
        assert script[part] == server[part], part
    assert console_errors(d) == []
    return server


def test_the_script_draws_what_the_server_drew(browser: Any, cluster: Placed) -> None:
    """The rows the script builds from the JSON API are the server's HTML, node for node."""
    drawn_twice(browser, cluster.sched.ops_url + "/?limit=5")


def test_the_script_draws_a_dra_nodes_gpus_as_the_server_did(
        browser: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A scheduler with DRA on shows a DRA node's GPUs from its ResourceSlices and the
    ResourceClaims allocated from them; the script's rows are the server's, DRA badge and
    claim slices included."""
    from tests.core.test_dra_report import _claim, _gpu, _result, _slices

    tmp = tmp_path_factory.mktemp("status-dra")
    with standin(tmp) as (api_url, kubeconfig):
        claim = _claim("c1", _result("gpu-1", pool="d-node", memory="4Gi", cores="30"),
                       pods=("serve",), namespace="team-d")
        items = [*_slices("d-node", _gpu(0), _gpu(1)),
                 {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **claim}]
        req = urllib.request.Request(f"{api_url}/_standin/objects",
                                     json.dumps({"items": items}).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.load(r)["created"] == len(items)
        sched = Scheduler(kubeconfig, tmp, config={"dra": {"enabled": True}},
                          ops_port=free_port())
        sched.start()
        try:
            anyio.run(sched.wait_ready)

            def two_gpus() -> bool:
                try:
                    with urllib.request.urlopen(sched.ops_url + "/api/v1/gpus",
                                                timeout=10) as r:
                        return len(json.load(r)["items"]) == 2
                except urllib.error.HTTPError:  # 503 while its DRA informers list
                    return False
            deadline = time.monotonic() + 30
            while not two_gpus():
                assert time.monotonic() < deadline, sched.log()
                time.sleep(0.05)
            server = drawn_twice(browser, sched.ops_url + "/?node=d-node")
            assert server["gpu-table"].count(">DRA</span>") == 2
            assert "team-d/serve" in server["gpu-table"]
        finally:
            sched.stop()


def test_pages_and_refreshes_without_reloading(browser: Any, cluster: Placed) -> None:
    d = browser
    console_errors(d)
    emulate(d, 1280, 800)
    load(d, cluster.sched.ops_url + "/?limit=3&refresh=1")
    assert d.find_element("id", "range").text == "1–3 of 8"
    d.execute_script("document.body.dataset.marker = 'same page';")
    d.find_element("id", "next").click()
    wait(d, "document.getElementById('range').textContent === '4–6 of 8'")
    assert "offset=3" in d.current_url and "refresh=1" in d.current_url
    d.find_element("id", "q").send_keys("late-arrival")
    wait(d, "location.search.includes('q=late-arrival')")
    assert rows(d) == []
    anyio.run(_schedule_one, cluster.api, cluster.sched.url)
    wait(d, "document.querySelectorAll('#gpu-table tbody tr').length === 1", timeout=15)
    assert "team-d/late-arrival" in rows(d)[0]
    assert d.execute_script("return document.body.dataset.marker;") == "same page"
    assert console_errors(d) == []
