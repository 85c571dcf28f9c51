"""A real headless Chromium for the status page's tests and benchmark.

:func:`obtain_browser` finds Debian's ``chromium`` and ``chromium-driver`` (installing
them with apt-get when they are missing and we are root, as tests/oci does for runc)
and selenium, and starts one headless browser to prove they work; it raises
:class:`BrowserUnavailable` saying why when that cannot be done. Nothing is fetched
from the network but the Debian packages: selenium is given both paths, so its
driver manager never runs.
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.debian import NotInstallable, apt_install

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

PACKAGES = ("chromium", "chromium-driver")


class BrowserUnavailable(RuntimeError):
    """No usable headless Chromium here; ``str()`` says why."""


def _find() -> tuple[str | None, str | None]:
    browser = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"),
                                "/usr/bin/chromium") if p and os.access(p, os.X_OK)), None)
    driver = next((p for p in (shutil.which("chromedriver"), "/usr/bin/chromedriver")
                   if p and os.access(p, os.X_OK)), None)
    return browser, driver


def install(timeout: float = 900) -> None:
    """``apt-get install chromium chromium-driver`` (:func:`tests.debian.apt_install`)."""
    try:
        apt_install(PACKAGES, lambda: all(_find()), timeout=timeout)
    except NotInstallable as e:
        raise BrowserUnavailable(str(e)) from None


def start(browser: str, driver: str, width: int = 1280, height: int = 800) -> WebDriver:
    """A headless Chromium that keeps its console log (``get_log('browser')``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-extensions", "--no-first-run", "--disable-background-networking",
                "--hide-scrollbars", f"--window-size={width},{height}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(executable_path=driver))


def obtain_browser(*, install_missing: bool = True) -> tuple[str, str]:
    """The paths of a Chromium and its driver that selenium can drive headless
    (installed with apt-get when missing, if ``install_missing``)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        raise BrowserUnavailable("selenium is not installed (pip install -e '.[test]')") from None
    browser, driver = _find()
    if (browser is None or driver is None) and install_missing:
        install()
        browser, driver = _find()
    if browser is None or driver is None:
        raise BrowserUnavailable("chromium or chromium-driver is not installed"
                                 + (" (apt-get did not provide it)" if install_missing else ""))
    try:
        d = start(browser, driver)
    except Exception as e:
        raise BrowserUnavailable(f"{browser} with {driver} does not start headless: "
                                 f"{type(e).__name__}: {e}") from None
    try:
        d.get("data:text/html,<p>ok</p>")
    finally:
        d.quit()
    return browser, driver


def emulate(d: WebDriver, width: int, height: int, *, mobile: bool = False,
            scale: float = 1) -> None:
    """Set the viewport exactly (a phone: ``mobile`` honours the viewport meta tag)."""
    d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": scale, "mobile": mobile})


def screenshot(d: WebDriver, path: Path, *, full: bool = False) -> Path:
    """A PNG of the viewport, or of the whole page (``full``)."""
    args: dict[str, Any] = {"format": "png"}
    if full:
        m = d.execute_cdp_cmd("Page.getLayoutMetrics", {})
        size = m["cssContentSize"]
        args |= {"captureBeyondViewport": True,
                 "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"],
                          "scale": 1}}
    shot = d.execute_cdp_cmd("Page.captureScreenshot", args)
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def console_errors(d: WebDriver) -> list[str]:
    """The console's errors since the last call (SEVERE: script errors, failed
    loads, Content-Security-Policy violations)."""
    return [e["message"] for e in d.get_log("browser") if e.get("level") == "SEVERE"]
