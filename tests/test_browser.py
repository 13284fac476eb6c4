"""End to end in a real browser: `streamlit run app.py` on a free localhost port, each page opened by its URL in
headless Chromium (Debian's /usr/bin/chromium + chromedriver, driven by Selenium), its heading awaited, no
exception box, and one screenshot per page under tests/output/browser/ (gitignored)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from workbench import REPO_ROOT

CHROMIUM = Path("/usr/bin/chromium")
OUT = REPO_ROOT / "tests" / "output" / "browser"
PAGES = [("", "Tree designer"), ("calibration", "Calibration"), ("tradeoffs", "Trade-offs"),
         ("live", "Live decode")]

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _driver_path() -> str | None:
    for p in ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver", shutil.which("chromedriver") or ""):
        if p and Path(p).is_file():
            return p
    return None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app under `streamlit run`, reading a synthetic calibration folder; yields its base URL."""
    from test_app import make_calibration, make_latency, make_sweep

    root = tmp_path_factory.mktemp("browser_calibration")
    cal = make_calibration(root / "synthetic")
    make_latency(cal / "latency-cpu.csv")
    make_sweep(cal / "sweep.csv")
    port = _free_port()
    env = dict(os.environ, WORKBENCH_CALIBRATION_ROOT=str(root), STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    log = open(tmp_path_factory.mktemp("streamlit_log") / "streamlit.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(REPO_ROOT / "app.py"),
                             "--server.headless", "true", "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
                            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                log.seek(0)
                pytest.fail(f"streamlit did not start:\n{log.read()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not CHROMIUM.is_file():
        pytest.skip("/usr/bin/chromium is absent (apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    driver_path = _driver_path()
    if driver_path is None:
        pytest.skip("chromedriver is absent (apt-get install -y chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
                "--no-first-run", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                "--window-size=1600,2000", f"--user-data-dir={tmp_path_factory.mktemp('chromium_profile')}"):
        opts.add_argument(arg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SE_OFFLINE", "true")  # never let Selenium Manager try to download a driver or browser
        driver = webdriver.Chrome(options=opts, service=Service(driver_path))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _wait(driver, predicate, timeout: float = 90, what: str = "", every: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("path,heading", PAGES)
def test_page_renders_in_chromium(server, browser, path, heading):
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/{path}")
    name = path or "tree"  # the designer is the default page: it lives at /
    _wait(browser, lambda: any(h.text.strip() == heading for h in browser.find_elements(By.TAG_NAME, "h1")),
          what=f"heading {heading!r}")

    def settled():  # the run has finished (no "Running... / Stop" status) and the page stopped changing
        status = " ".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]'))
        snapshot = browser.find_element(By.TAG_NAME, "body").text
        idle = "Running" not in status and "Stop" not in status
        if idle and snapshot == seen.get("text"):
            return True
        seen["text"] = snapshot
        return False

    seen: dict = {}
    _wait(browser, settled, what="the script run to finish", every=1.5)
    if path != "live":  # every other page draws figures from the synthetic calibration
        _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, '[data-testid="stImage"] img'),
              what="a figure")
    OUT.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(OUT / f"{name}.png"))
    assert "Page not found" not in browser.find_element(By.TAG_NAME, "body").text
    boxes = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    assert not boxes, boxes[0].text[:2000]
    errors = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stAlertContentError"]')
    assert not errors, errors[0].text[:2000]


def test_live_decode_in_chromium(server, browser, tiny_llama):
    """Type a (tiny random) model and heads into the live page, press the button, see the coloured answer."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(f"{server}/live")
    _wait(browser, lambda: any(h.text.strip() == "Live decode" for h in browser.find_elements(By.TAG_NAME, "h1")),
          what="the live page")
    for label, value in (("Model (blank: the demo SmolLM2-135M-Instruct)", tiny_llama.model_dir),
                         ("Heads (blank: the demo heads)", tiny_llama.heads_dirs["2"])):
        box = _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, f'input[aria-label="{label}"]'),
                    what=label)[0]
        box.send_keys(str(value) + Keys.ENTER)
        _wait(browser, lambda: box.get_attribute("value") == str(value), what=f"{label} to take the value")
        time.sleep(1.0)
    button = next(b for b in browser.find_elements(By.TAG_NAME, "button") if b.text == "Load model and generate")
    button.click()
    _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, 'span[title="step 1"]'), timeout=120,
          what="the coloured answer")
    _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, '[data-testid="stImage"] img'), what="figures")
    time.sleep(1.5)
    OUT.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(OUT / "live-decoded.png"))
    assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stAlertContentError"]')
    assert "Output equals vanilla greedy" in browser.find_element(By.TAG_NAME, "body").text
