"""The console against a cluster with TLS and users and ACLs on (``raftmq cluster up --tls
--acl``; the console finds the name server and the CA through ``--dir``'s cluster.json), in
a real Chromium: the page asks to sign in, acts with the signed-in user's rights, and a user
without the right sees the action refused, naming the user, the action and the resource;
the replicas' status and the charts are read over https."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from client import Admin, Credentials, Message, Producer
from client.cli_cluster import cluster_tls
from tests.console.conftest import console_process, raftmq, screenshot, wait_for
from tests.console.test_console_pages import click, confirm, notice, open_page, page_texts

pytestmark = [pytest.mark.console]

VIEWER = Credentials("viewer", "viewer-password")


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A name server and one 3-replica group with TLS and ACLs on; topic ``orders``; a user
    ``viewer`` who may read the cluster and topics but not change them."""
    d = tmp_path_factory.mktemp("acl-cluster") / "c"
    try:
        up = raftmq("cluster", "up", "--tls", "--acl", "--dir", str(d), "--namesrv-port", "0")
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((d / "cluster.json").read_text())
        namesrv, tls = state["namesrv"]["address"], cluster_tls(state)
        admin_creds = Credentials.from_file(d / "admin.credentials")
        admin = Admin(namesrv, credentials=admin_creds, tls=tls)
        try:
            admin.create_topic("orders", 2)
            admin.put_user(VIEWER.user, VIEWER.password)
            admin.grant(VIEWER.user, "cluster", ["get", "list"])
            admin.grant(VIEWER.user, "topic:*", ["get"])
        finally:
            admin.close()
        yield {"dir": d, "namesrv": namesrv, "admin": admin_creds, "tls": tls}
    finally:
        raftmq("cluster", "down", "--dir", str(d))


@pytest.fixture(scope="module")
def acl_console(acl_cluster: dict[str, Any]) -> Iterator[str]:
    with console_process("--dir", str(acl_cluster["dir"])) as base:
        yield base


def sign_in(driver: WebDriver, base: str, who: Credentials) -> None:
    driver.get("about:blank")
    driver.get(f"{base}/#/login")
    wait_for("the login form", lambda: driver.find_element(By.ID, "login-user"))
    driver.find_element(By.ID, "login-user").send_keys(who.user)
    driver.find_element(By.ID, "login-password").send_keys(who.password)
    click(driver, "the sign-in button", By.ID, "login-submit")
    wait_for(f"signed in as {who.user}", lambda: f"signed in as {who.user}" in
             driver.find_element(By.ID, "who").text)


def test_a_page_asks_to_sign_in_and_a_wrong_password_is_refused(acl_console: str,
                                                                 browser: WebDriver) -> None:
    browser.delete_all_cookies()
    browser.get("about:blank")
    browser.get(f"{acl_console}/#/topics")
    wait_for("the login page", lambda: browser.execute_script("return location.hash") == "#/login")
    browser.find_element(By.ID, "login-user").send_keys(VIEWER.user)
    browser.find_element(By.ID, "login-password").send_keys("wrong")
    click(browser, "the sign-in button", By.ID, "login-submit")
    notice(browser, "wrong user name or password")
    screenshot(browser, "login-refused")


def test_a_user_without_the_right_sees_the_action_refused(acl_console: str, browser: WebDriver) -> None:
    browser.delete_all_cookies()
    sign_in(browser, acl_console, VIEWER)
    open_page(browser, acl_console, "topics")
    wait_for("orders listed", lambda: "orders" in page_texts(browser, "#topic-list td"))
    click(browser, "orders' delete button", By.CSS_SELECTOR, "button[data-topic='orders']")
    confirm(browser, "Delete topic orders?")
    text = notice(browser, "NO_PERMISSION")
    assert "user 'viewer' may not delete on topic:orders" in text, text
    screenshot(browser, "acl-refused")
    open_page(browser, acl_console, "topics")  # still there
    wait_for("orders still listed", lambda: "orders" in page_texts(browser, "#topic-list td"))


def test_a_user_with_the_right_does_it(acl_cluster: dict[str, Any], acl_console: str,
                                      browser: WebDriver) -> None:
    browser.delete_all_cookies()
    sign_in(browser, acl_console, acl_cluster["admin"])
    open_page(browser, acl_console, "topics")
    browser.find_element(By.ID, "topic-name").send_keys("made-by-admin")
    click(browser, "the save button", By.ID, "topic-save")
    notice(browser, "made-by-admin")
    wait_for("made-by-admin listed", lambda: "made-by-admin" in page_texts(browser, "#topic-list td"))


def test_the_cluster_page_reads_every_replica_and_its_metrics_over_https(
        acl_cluster: dict[str, Any], acl_console: str, browser: WebDriver) -> None:
    """The console's replica rows come from each replica's /status, the charts from /metrics:
    both over https, verified against the cluster's CA."""
    browser.delete_all_cookies()
    sign_in(browser, acl_console, acl_cluster["admin"])
    open_page(browser, acl_console, "cluster")
    roles = wait_for("3 replicas of g1", lambda: (lambda r: len(r) == 3 and r)(page_texts(
        browser, "#group-g1 table:first-of-type tbody tr td:nth-child(3)")))
    assert sorted(roles) == ["follower", "follower", "leader"]
    with Producer(acl_cluster["namesrv"], credentials=acl_cluster["admin"], tls=acl_cluster["tls"]) as p:
        for i in range(40):
            p.send(Message("orders", f"m{i}".encode()))

    def produce_rate() -> float | None:
        with urllib.request.urlopen(f"{acl_console}/api/overview", timeout=5) as resp:
            rates = json.loads(resp.read())["series"]["produce"]
        return max((r for r in rates if r is not None), default=0.0) or None

    assert wait_for("a produce rate above 0 sampled from /metrics", produce_rate, 10) > 0
    screenshot(browser, "cluster-tls-acl")
