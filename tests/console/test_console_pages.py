"""The web console in a real Chromium against a live 3-node cluster: every page loads and
does what it says, checked against the cluster through the client. The tests run in file
order on one cluster (the last one kills the leader). Each saves a screenshot into
docs/console/ (docs/CONSOLE.md shows them)."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from client import ConsumeStatus, Message, Producer, PullConsumer, PushConsumer
from tests.console.conftest import raftmq, screenshot, wait_for

pytestmark = [pytest.mark.console]


def open_page(driver: WebDriver, base: str, page: str) -> None:
    """Load the page afresh (a hash-only change to the same URL would keep the old one)."""
    driver.get("about:blank")
    driver.get(f"{base}/#/{page}")
    wait_for(f"the {page} page", lambda: driver.find_element(By.ID, f"nav-{page}").get_attribute("class")
             == "active")


def page_texts(driver: WebDriver, selector: str, attribute: str | None = None) -> list[str]:
    """The text (or ``attribute``) of every element ``selector`` matches, read in one go
    inside the page: live pages re-render every second, so elements found earlier go stale."""
    return list(driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map("
        "e => arguments[1] ? e.getAttribute(arguments[1]) : e.textContent)", selector, attribute))


def click(driver: WebDriver, what: str, by: str, selector: str) -> None:
    """Click the element once it is there (a live page may replace it between find and click)."""
    wait_for(what, lambda: driver.find_element(by, selector).click() or True)


def notice(driver: WebDriver, contains: str) -> str:
    def shown() -> str | None:
        el = driver.find_element(By.ID, "notice")
        return el.text if el.is_displayed() and contains in el.text else None

    return wait_for(f"a notice saying {contains!r}", shown)


def confirm(driver: WebDriver, mentions: str) -> None:
    dialog = driver.find_element(By.ID, "confirm")
    wait_for("the confirmation dialog", dialog.is_displayed, 5)
    assert mentions in driver.find_element(By.ID, "confirm-text").text
    driver.find_element(By.ID, "confirm-ok").click()


def test_cluster_page_shows_every_replica_and_live_charts(cluster: dict[str, Any], console: str,
                                                          browser: WebDriver) -> None:
    with Producer(namesrv=cluster["namesrv"]) as p:
        from client import Admin
        admin = Admin(cluster["namesrv"])
        admin.create_topic("warmup", 2)
        admin.close()
        open_page(browser, console, "cluster")
        for i in range(60):  # traffic for the charts while the page samples it
            p.send(Message("warmup", f"m{i}".encode()))
            time.sleep(0.03)
    reader = PullConsumer(namesrv=cluster["namesrv"], group="warmup-reader").start()
    try:
        reader.assign(reader.queues("warmup"), "first")
        read: list[Any] = []
        wait_for("the warmup messages read", lambda: read.extend(reader.poll(8, 0.2)) or len(read) >= 60)
    finally:
        reader.shutdown()
    roles = wait_for("3 replicas of g1", lambda: (lambda r: len(r) == 3 and r)(page_texts(
        browser, "#group-g1 table:first-of-type tbody tr td:nth-child(3)")))
    assert sorted(roles) == ["follower", "follower", "leader"]
    leader = page_texts(browser, "#leader-g1", "data-leader")[0]
    assert leader in cluster["state"]["groups"]["g1"]
    header = " ".join(page_texts(browser, "#group-g1 thead th")).lower()
    for column in ("term", "commit", "applied", "replication lag", "disk free", "version", "uptime"):
        assert column in header
    verified = raftmq("cluster", "verify", "--dir", str(cluster["dir"]))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    shown = wait_for("the last comparison on the page", lambda: (lambda t: "equal" in t and t)(
        page_texts(browser, "#verify-g1")[0]), 10)
    assert "Last compared at index" in shown and "n1, n2, n3" in shown
    with urllib.request.urlopen(f"{console}/api/cluster", timeout=5) as resp:
        (made,) = [g["last_verify"] for g in json.loads(resp.read())["groups"] if g["group"] == "g1"]
    assert abs(made["at_ms"] / 1000 - time.time()) < 60, made  # the comparison just made
    rendered = browser.execute_script("return new Date(arguments[0]).toLocaleString()", made["at_ms"])
    assert f"Last compared at index {made['index']}, {rendered}: equal" in shown, (shown, rendered)
    def charted() -> dict[str, Any]:  # what the charts draw
        with urllib.request.urlopen(f"{console}/api/overview", timeout=5) as resp:
            return dict(json.loads(resp.read())["series"])

    def positive(values: list[float | None]) -> bool:
        return any(v is not None and v > 0 for v in values)

    series = wait_for("produce and consume rates above 0 in the charted series", lambda: (
        lambda s: positive(s["produce"]) and positive(s["consume"]) and s)(charted()), 10)
    assert positive(series["p99_ms"])
    for chart in ("produce", "consume", "p99_ms"):
        assert page_texts(browser, f"#chart-{chart} polyline", "points")[0]
    wait_for("10 s of samples on the charts (for the screenshot)", lambda: int(
        page_texts(browser, "#chart-produce svg text")[-1].split()[1]) >= 10, 15)
    screenshot(browser, "cluster")


def test_topic_created_in_the_ui_takes_sends_and_consumes(cluster: dict[str, Any], console: str,
                                                          browser: WebDriver) -> None:
    open_page(browser, console, "topics")
    browser.find_element(By.ID, "topic-name").send_keys("ui-orders")
    queues = browser.find_element(By.ID, "topic-queues")
    queues.clear()
    queues.send_keys("4")
    browser.find_element(By.ID, "topic-save").click()
    notice(browser, "topic ui-orders saved on g1")
    with Producer(namesrv=cluster["namesrv"]) as p:
        sent = [p.send(Message("ui-orders", f"order {i}".encode()), shard_key=f"k{i}").msg_id
                for i in range(8)]
    consumer = PullConsumer(namesrv=cluster["namesrv"], group="ui-check").start()
    try:
        consumer.assign(consumer.queues("ui-orders"), "first")
        got: list[str] = []
        wait_for("the 8 messages consumed", lambda: got.extend(m.msg_id for m in consumer.poll(32, 0.5))
                 or len(got) >= 8)
    finally:
        consumer.shutdown()
    assert sorted(got) == sorted(sent)
    row = wait_for("ui-orders listed with 8 messages", lambda: (lambda el: "8" in el.text and el)(
        browser.find_element(By.ID, "topic-row-ui-orders")))
    assert "g1" in row.text
    screenshot(browser, "topics")


def test_delete_asks_for_confirmation(cluster: dict[str, Any], console: str, browser: WebDriver) -> None:
    open_page(browser, console, "topics")
    browser.find_element(By.ID, "topic-name").send_keys("doomed")
    browser.find_element(By.ID, "topic-save").click()
    notice(browser, "topic doomed saved")
    click(browser, "doomed's delete button", By.CSS_SELECTOR, "button[data-topic='doomed']")
    wait_for("the dialog", browser.find_element(By.ID, "confirm").is_displayed, 5)
    browser.find_element(By.ID, "confirm-cancel").click()
    assert browser.find_elements(By.ID, "topic-row-doomed")  # cancelled: still there
    click(browser, "doomed's delete button", By.CSS_SELECTOR, "button[data-topic='doomed']")
    confirm(browser, "Delete topic doomed?")
    notice(browser, "topic doomed deleted")
    wait_for("doomed gone from the list", lambda: not browser.find_elements(By.ID, "topic-row-doomed"))


def test_a_message_sent_with_a_key_is_found_and_its_body_shown(cluster: dict[str, Any], console: str,
                                                               browser: WebDriver) -> None:
    body = {"order": 42, "state": "paid"}
    with Producer(namesrv=cluster["namesrv"]) as p:
        r = p.send(Message("ui-orders", json.dumps(body).encode(), tags="paid", keys=["order-42"],
                           properties={"region": "eu"}))
    open_page(browser, console, "messages")
    browser.find_element(By.ID, "msg-topic").send_keys("ui-orders")
    Select(browser.find_element(By.ID, "msg-by")).select_by_value("key")
    browser.find_element(By.ID, "msg-value").send_keys("order-42")
    browser.find_element(By.ID, "msg-search").click()
    wait_for("the message in the results", lambda: browser.find_element(
        By.CSS_SELECTOR, f"tr[data-msg='{r.msg_id}']")).click()
    shown = wait_for("its body", lambda: browser.find_element(By.ID, "msg-body").text)
    assert json.loads(shown) == body
    holders = wait_for("3 replicas holding it", lambda: (lambda t: t.count("holds it") == 3 and t)(
        browser.find_element(By.ID, "msg-holders").text))
    assert "does not" not in holders
    assert "region" in browser.find_element(By.ID, "msg-card").text
    browser.find_element(By.ID, "view-json").click()
    assert browser.find_element(By.ID, "msg-body").text == json.dumps(body, indent=2)
    browser.find_element(By.ID, "view-hex").click()
    assert browser.find_element(By.ID, "msg-body").text.startswith("000000  7b 22 6f")  # {"o
    browser.find_element(By.ID, "view-json").click()
    screenshot(browser, "messages")

    Select(browser.find_element(By.ID, "msg-by")).select_by_value("time")  # the time-range search
    browser.find_element(By.ID, "msg-value").clear()
    browser.find_element(By.ID, "msg-search").click()  # no bounds: from 0 to now
    wait_for("the message found by time", lambda: browser.find_element(
        By.CSS_SELECTOR, f"tr[data-msg='{r.msg_id}']"))


def test_a_groups_lag_falls_to_zero_after_consuming_and_reset_brings_it_back(
        cluster: dict[str, Any], console: str, browser: WebDriver) -> None:
    from client import Admin
    admin = Admin(cluster["namesrv"])
    admin.create_topic("ui-lag", 2)
    admin.close()
    with Producer(namesrv=cluster["namesrv"]) as p:
        for i in range(10):
            p.send(Message("ui-lag", f"m{i}".encode()))
    consumer = PullConsumer(namesrv=cluster["namesrv"], group="billing").start()
    try:
        consumer.assign(consumer.queues("ui-lag"), "first")
        consumer.commit()  # offsets at 0: the whole topic is lag
        open_page(browser, console, "groups")
        lag = lambda: browser.find_element(By.ID, "lag-billing").text  # noqa: E731
        wait_for("billing's lag of 10", lambda: lag() == "10")
        got: list[Any] = []
        wait_for("10 consumed", lambda: got.extend(consumer.poll(32, 0.5)) or len(got) >= 10)
        consumer.commit()
        wait_for("billing's lag at 0", lambda: lag() == "0")
    finally:
        consumer.shutdown()
    click(browser, "billing's row", By.XPATH, "//tr[td[1][text()='billing']]")
    wait_for("billing's queues", lambda: browser.find_element(By.ID, "reset-offsets"))
    wait_for("the reset form", lambda: Select(browser.find_element(By.ID, "reset-topic")).select_by_value(
        "ui-lag") or True)  # billing's only topic: the same if the form is drawn again
    browser.execute_script("document.getElementById('reset-time').value = '2020-01-01T00:00:00'")
    click(browser, "reset", By.ID, "reset-offsets")
    confirm(browser, "Reset billing's offsets on ui-lag")
    notice(browser, "billing reset on ui-lag")
    wait_for("billing's lag back at 10", lambda: lag() == "10")
    screenshot(browser, "groups")


def test_a_dead_letter_is_listed_and_resent(cluster: dict[str, Any], console: str,
                                            browser: WebDriver) -> None:
    from client import Admin
    admin = Admin(cluster["namesrv"])
    admin.create_topic("ui-dlq", 1)
    consumer = PushConsumer(namesrv=cluster["namesrv"], group="fails", topic="ui-dlq", from_where="first",
                            max_reconsume_times=0, rebalance_interval=1.0)
    consumer.register(lambda msgs, ctx: ConsumeStatus.RECONSUME_LATER)  # straight to %DLQ%fails
    consumer.start()
    try:
        with Producer(namesrv=cluster["namesrv"]) as p:
            r = p.send(Message("ui-dlq", b"poison", keys=["poison-1"]))
        open_page(browser, console, "dlq")
        browser.find_element(By.ID, "dlq-group").send_keys("fails")

        def listed() -> Any:
            browser.find_element(By.ID, "dlq-show").click()
            return wait_for("the listing", lambda: browser.find_elements(By.CSS_SELECTOR,
                            f"button[data-resend='{r.msg_id}']") or browser.find_elements(By.ID, "dlq-none"),
                            5) and browser.find_elements(By.CSS_SELECTOR, f"button[data-resend='{r.msg_id}']")

        wait_for("the dead letter listed", listed, 30, every=0.5)
        assert "ui-dlq" in browser.find_element(By.ID, "dlq-list").text
        screenshot(browser, "dead-letters")
        # looked up again at the click: a listing answered late re-renders the list, and a button
        # found before is then stale (fresh-clone CI run 1 of 9846a9b)
        wait_for("the resend button clicked", lambda: browser.find_element(
            By.CSS_SELECTOR, f"button[data-resend='{r.msg_id}']").click() or True)
        notice(browser, f"resent {r.msg_id} to ui-dlq")
        again = wait_for("the resent copy in ui-dlq", lambda: (lambda found: len(found) >= 2 and found)(
            admin.messages_by_key("ui-dlq", "poison-1")))
        assert {m.body for m in again} == {b"poison"}

        open_page(browser, console, "messages")  # and a message resent to one group alone
        browser.find_element(By.ID, "msg-topic").send_keys("ui-dlq")
        Select(browser.find_element(By.ID, "msg-by")).select_by_value("id")
        browser.find_element(By.ID, "msg-value").send_keys(r.msg_id)
        browser.find_element(By.ID, "msg-search").click()
        wait_for("the message", lambda: browser.find_element(
            By.CSS_SELECTOR, f"tr[data-msg='{r.msg_id}']")).click()
        wait_for("the resend form", lambda: browser.find_element(By.ID, "resend-group")).send_keys("fails")
        browser.find_element(By.ID, "resend-to-group").click()
        notice(browser, "resent to fails through %RETRY%fails")
    finally:
        consumer.shutdown()
        admin.close()


def test_a_killed_leader_shows_as_a_new_leader_without_a_reload(cluster: dict[str, Any], console: str,
                                                                browser: WebDriver) -> None:
    """The open page follows a failover by itself (a liveness deadline of 30 s; how long it took
    is printed: the live update's speed is not asserted)."""
    open_page(browser, console, "cluster")
    old = wait_for("a leader", lambda: page_texts(browser, "#leader-g1", "data-leader")[0])
    os.kill(cluster["state"]["groups"]["g1"][old]["pid"], signal.SIGKILL)
    killed = time.monotonic()
    new = wait_for("a new leader on the page", lambda: (lambda n: n not in ("", old) and n)(
        page_texts(browser, "#leader-g1", "data-leader")[0]), 30.0, every=0.05)
    took = time.monotonic() - killed
    assert new in cluster["state"]["groups"]["g1"], f"{new} shown as the leader: not a replica"
    print(f"new leader {new} shown {took:.2f} s after the kill")
    wait_for("the old leader shown down", lambda: "down" in page_texts(browser, "#group-g1")[0])
    wait_for("the change in the leader history", lambda: new in page_texts(
        browser, "#group-g1 table:nth-of-type(2) tbody tr:first-child td:nth-child(3)"), 30)
    screenshot(browser, "cluster-failover")
