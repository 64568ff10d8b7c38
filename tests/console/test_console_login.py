"""The console against a cluster with users and ACLs on (``raftmq cluster up --acl``), in a
real Chromium: the page asks to sign in, acts with the signed-in user's rights, and a user
without the right sees the action refused, naming the user, the action and the resource."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from client import Admin, Credentials
from tests.console.conftest import console_process, raftmq, screenshot, wait_for
from tests.console.test_console_pages import click, confirm, notice, open_page, page_texts

pytestmark = [pytest.mark.console]

VIEWER = Credentials("viewer", "viewer-password")


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A name server and one 3-replica group with ACLs on; topic ``orders``; a user
    ``viewer`` who may read the cluster and topics but not change them."""
    d = tmp_path_factory.mktemp("acl-cluster") / "c"
    try:
        up = raftmq("cluster", "up", "--acl", "--dir", str(d), "--namesrv-port", "0")
        assert up.returncode == 0, up.stdout + up.stderr
        namesrv = json.loads((d / "cluster.json").read_text())["namesrv"]["address"]
        admin_creds = Credentials.from_file(d / "admin.credentials")
        admin = Admin(namesrv, credentials=admin_creds)
        try:
            admin.create_topic("orders", 2)
            admin.put_user(VIEWER.user, VIEWER.password)
            admin.grant(VIEWER.user, "cluster", ["get", "list"])
            admin.grant(VIEWER.user, "topic:*", ["get"])
        finally:
            admin.close()
        yield {"dir": d, "namesrv": namesrv, "admin": admin_creds}
    finally:
        raftmq("cluster", "down", "--dir", str(d))


@pytest.fixture(scope="module")
def acl_console(acl_cluster: dict[str, Any]) -> Iterator[str]:
    with console_process(acl_cluster["namesrv"]) as base:
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
