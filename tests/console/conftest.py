"""Fixtures of the browser tests: a live 3-node cluster (``raftmq cluster up``), the
console in its own process, and a real headless Chromium driven by Selenium through
Debian's ``chromium`` and ``chromium-driver`` (installed by scripts/bootstrap). Every
process is stopped by its PID (the cluster by ``raftmq cluster down``), even on failure."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import stop_popen, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
_ROOT = Path(__file__).resolve().parents[2]
#: where screenshots go: bench-out/console/ (untracked), or docs/console/ -- what
#: docs/CONSOLE.md shows -- when RAFTMQ_UPDATE_SCREENSHOTS=1
SHOTS = _ROOT / ("docs" if os.environ.get("RAFTMQ_UPDATE_SCREENSHOTS") == "1" else "bench-out") / "console"


def raftmq(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raftmq", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``{"dir", "namesrv", "state"}`` of a running name server + one 3-replica group."""
    d = tmp_path_factory.mktemp("cluster") / "c"
    try:
        up = raftmq("cluster", "up", "--dir", str(d), "--namesrv-port", "0")
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((d / "cluster.json").read_text())
        yield {"dir": d, "namesrv": state["namesrv"]["address"], "state": state}
    finally:
        raftmq("cluster", "down", "--dir", str(d))


@contextlib.contextmanager
def console_process(*where: str) -> Iterator[str]:
    """A console in its own process on a free port, of the cluster ``where`` names (``--namesrv
    H:P`` or ``--dir D``, and any TLS flags): its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "raftmq", "console", *where,
                             "--listen", "127.0.0.1:0", "--sample-interval", "0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("console at "), line + proc.stdout.read()  # type: ignore[union-attr]
        yield line.split()[2].rstrip("/")
    finally:
        stop_popen(proc)


@pytest.fixture(scope="module")
def console(cluster: dict[str, Any]) -> Iterator[str]:
    """The console's base URL (its own process, on a free port)."""
    with console_process("--namesrv", cluster["namesrv"]) as base:
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium (Selenium WebDriver), 1400x900."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    assert not missing, f"{missing} missing: run scripts/bootstrap (apt-get install chromium chromium-driver)"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900",
                "--disable-gpu", "--lang=en-GB"):
        options.add_argument(arg)
    service = Service(CHROMEDRIVER)
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()
        service.stop()


def wait_for(what: str, check: Any, timeout: float = 15.0, every: float = 0.1) -> Any:
    """Poll ``check()`` until it returns something truthy (an exception -- an element
    replaced while read -- is "not yet"); TimeoutError naming ``what`` after ``timeout``."""
    return wait_until(check, timeout, every, what)


def screenshot(driver: Any, name: str) -> Path:
    """Save the page as SHOTS/NAME.png (docs/CONSOLE.md shows docs/console/)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    tmp = path.with_suffix(".tmp.png")
    driver.save_screenshot(str(tmp))
    shutil.move(tmp, path)
    return path
