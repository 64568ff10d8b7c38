"""Signs in to the console at URL (run on the deploy test's client host) and prints, as JSON,
what its cluster and consumer-group endpoints show: ``python console_check.py URL CREDENTIALS``."""

from __future__ import annotations

import http.cookiejar
import json
import sys
import time
import urllib.request
from pathlib import Path


def main() -> None:
    base, creds = sys.argv[1], Path(sys.argv[2]).read_text().splitlines()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    deadline = time.monotonic() + 30
    while True:
        try:
            whoami = json.loads(opener.open(f"{base}/api/whoami", timeout=5).read())
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    login = urllib.request.Request(f"{base}/api/login", method="POST",
                                   data=json.dumps({"user": creds[0], "password": creds[1]}).encode(),
                                   headers={"Content-Type": "application/json",
                                            "X-CSRF-Token": whoami["csrf"]})
    signed = json.loads(opener.open(login, timeout=30).read())
    cluster = json.loads(opener.open(f"{base}/api/cluster", timeout=30).read())
    groups = json.loads(opener.open(f"{base}/api/groups", timeout=30).read())
    print(json.dumps({"before": whoami.get("user"), "user": signed["user"], "cluster": cluster,
                      "groups": groups}))


if __name__ == "__main__":
    main()
