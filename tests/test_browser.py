"""The Jupyter path in a real browser (docs/jupyter_browser.md): JupyterLab on the project's venv, on loopback
with a token, driven by headless Chromium through Selenium, opens notebook 00 and notebook 01, runs all cells
on the `artifact` kernel and waits for the claim cell's verdict. The notebooks are copies in a temporary
folder and write into a temporary data/ and results/ (as nbval does), so the checkout stays clean.

Skipped with the reason when Chromium, its driver or selenium is missing (.ci/run installs Chromium and its
driver from apt when it can)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ("00_quickstart", "01_working_set")  # the two cheapest on the cpu profile
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
START_S, RUN_S = 120, 900  # JupyterLab answering; one notebook's Run All (01 records its traces)
# The network is closed: no first-run, sync, component or background fetches; a fresh profile each time.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1000",
)

pytestmark = pytest.mark.slow


def _missing() -> str:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if not CHROMIUM or not DRIVER:
        return "needs chromium and chromedriver on PATH (Debian: apt-get install chromium chromium-driver)"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """JupyterLab serving copies of the notebooks from tmp_path/notebooks; yields (url, token, log path)."""
    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    for name in NOTEBOOKS:
        shutil.copy(ROOT / "notebooks" / f"{name}.ipynb", nb_dir)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tasks").symlink_to(ROOT / "data" / "tasks", target_is_directory=True)
    # Every cell rendered (no windowing), so the last cell's output is in the page without scrolling.
    settings = tmp_path / "lab-settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    news = tmp_path / "lab-settings" / "@jupyterlab" / "apputils-extension"  # no news to fetch, no toast
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    token, port = secrets.token_hex(16), _free_port()
    env = dict(
        os.environ,
        ARTIFACT_DATA=str(tmp_path / "data"),
        ARTIFACT_OUTPUT=str(tmp_path / "results"),
        ARTIFACT_CACHE=os.environ.get("ARTIFACT_CACHE", str(ROOT / ".cache")),  # the tiny checkpoint
        JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        PYTHONHASHSEED="0",
    )
    log = tmp_path / "jupyterlab.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={nb_dir}",
        f"--LabApp.user_settings_dir={tmp_path / 'lab-settings'}",
        f"--LabApp.workspaces_dir={tmp_path / 'lab-workspaces'}",
        "--LabApp.extension_manager=readonly",
    ]  # no extension index to fetch: the network is closed
    if os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and CI runners often run as root
    with open(log, "wb") as out:
        server = subprocess.Popen(cmd, cwd=nb_dir, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, f"JupyterLab exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, (
                f"JupyterLab did not answer in {START_S} s: {log.read_text()[-2000:]}"
            )
            time.sleep(1)
        yield url, token, tmp_path
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def _click_menu(driver, menu: str, item: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(
        By.XPATH, f"//div[contains(@class, 'lm-MenuBar-itemLabel') and text()='{menu}']"
    ).click()
    driver.find_element(By.XPATH, f"//div[contains(@class, 'lm-Menu-itemLabel') and text()='{item}']").click()


def _session(url: str, token: str, name: str) -> dict:
    """The server's session for the notebook: its kernel's name and execution_state (idle, busy)."""
    with urllib.request.urlopen(f"{url}/api/sessions?token={token}", timeout=10) as r:
        sessions = json.load(r)
    return next((s["kernel"] for s in sessions if s["path"].endswith(f"{name}.ipynb")), {})


def _run_notebook(driver, url: str, token: str, name: str) -> str:
    """Open the notebook, make sure it runs on the artifact kernel, Run All Cells; return the notebook's
    text in the page once the kernel is idle again and the last cell printed a verdict."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver.get(f"{url}/lab/tree/{name}.ipynb?token={token}&reset")
    cell = (By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Cell")
    WebDriverWait(driver, START_S).until(EC.presence_of_element_located(cell))
    # The notebook names the kernel in its metadata; if JupyterLab asks anyway, choose it in the dialog.
    deadline = time.monotonic() + START_S
    while (k := _session(url, token, name)).get("name") != "artifact" or k.get("execution_state") != "idle":
        for select in driver.find_elements(By.CSS_SELECTOR, ".jp-Dialog select"):
            Select(select).select_by_visible_text("artifact (.venv)")
            driver.find_element(By.CSS_SELECTOR, ".jp-Dialog .jp-mod-accept").click()
        assert time.monotonic() < deadline, f"{name}: kernel {k} is not an idle artifact kernel"
        time.sleep(1)
    panel = ".jp-NotebookPanel:not(.lm-mod-hidden)"
    _click_menu(driver, "Run", "Run All Cells")

    def finished(d):
        failed = [
            e.text
            for e in d.find_elements(By.CSS_SELECTOR, f"{panel} .jp-OutputArea-output")
            if "Traceback" in e.text
        ]
        if failed:
            raise AssertionError(f"{name}: a cell failed:\n{failed[0][-3000:]}")
        cells = d.find_elements(By.CSS_SELECTOR, f"{panel} .jp-CodeCell")
        out = cells[-1].find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output") if cells else []
        return (
            bool(out)
            and "verdict" in out[-1].text
            and _session(url, token, name)["execution_state"] == "idle"
        )

    WebDriverWait(driver, RUN_S, poll_frequency=2).until(finished)
    return driver.find_element(By.CSS_SELECTOR, panel).text


@pytest.mark.skipif(bool(_missing()), reason=_missing() or "-")
def test_jupyterlab_runs_two_notebooks_in_a_headless_browser(lab, browser):
    url, token, tmp = lab
    before = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    texts = {}
    for name in NOTEBOOKS:
        texts[name] = _run_notebook(browser, url, token, name)
        browser.save_screenshot(str(tmp / f"{name}.png"))  # the page at the end, to look at
        (tmp / f"{name}.txt").write_text(texts[name])
        assert "claim:" in texts[name], texts[name][-2000:]
        assert (tmp / "results" / "cpu" / "data" / f"{name}.claims.json").is_file()  # written to the temp dir
    assert "seeded random weights" in texts["00_quickstart"]  # why the generated text is gibberish
    after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    assert after == before, f"the browser run changed the checkout:\n{after}"
