"""The shell lines of the docs' ``bash`` blocks, so the deploy test runs a command as written.

``documented(doc, needle)`` is the one line of ``docs/DOC``'s fenced ``bash`` blocks that
contains ``needle``, its trailing comment cut (``  # ...``); it fails when there is none or
more than one, so a docs change that drops or duplicates a step the test follows fails the
test instead of leaving it to follow a command the docs no longer give.
"""

from __future__ import annotations

import re

from tests.deploy.hosts import REPO

__all__ = ["bash_lines", "documented", "exported"]

DOCS = REPO / "docs"
_COMMENT = re.compile(r"\s+#.*$")


def bash_lines(doc: str) -> list[str]:
    """The lines inside ```` ```bash ```` fences of ``docs/DOC`` (comment lines and trailing
    comments dropped, continuation lines joined)."""
    lines: list[str] = []
    inside = False
    pending = ""
    for raw in (DOCS / doc).read_text().splitlines():
        text = raw.strip()
        if text.startswith("```"):
            inside = text == "```bash" if not inside else False
            continue
        if not inside or not text or text.startswith("#"):
            continue
        text = _COMMENT.sub("", text)
        if text.endswith("\\"):
            pending += text[:-1].strip() + " "
            continue
        lines.append(pending + text)
        pending = ""
    return lines


def documented(doc: str, needle: str) -> str:
    """The one bash line of ``docs/DOC`` containing ``needle``."""
    found = [line for line in bash_lines(doc) if needle in line]
    assert len(found) == 1, f"docs/{doc}: {len(found)} bash lines contain {needle!r}: {found}"
    return found[0]


def exported(doc: str, name: str) -> str:
    """The value ``docs/DOC`` has the operator ``export NAME=...``."""
    line = documented(doc, f"export {name}=")
    return line.split("=", 1)[1].strip()

