"""Secure by default off loopback for a broker and a name server (``protocol.exposure``, the
table of what each process needs): a refusal is a ``ConfigError``, so the process prints
one ``error:`` line and exits 2 like any other bad configuration."""

from __future__ import annotations

import logging

from common.toml_config import ConfigError
from protocol.exposure import ExposureRefused
from protocol.exposure import check_exposure as check_listen

__all__ = ["check_exposure"]


def check_exposure(what: str, listen: str, *, tls: bool, acl: bool | None, insecure: bool,
                   how: str, log: logging.Logger) -> None:
    """``protocol.exposure.check_exposure``, raising ConfigError instead of ExposureRefused."""
    try:
        check_listen(what, listen, tls=tls, acl=acl, insecure=insecure, how=how, log=log)
    except ExposureRefused as e:
        raise ConfigError(str(e)) from None
