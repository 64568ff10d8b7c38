"""The wire: one frame per WebSocket message (``frame``) carrying a code (``codes``).

Importers use ``protocol.remoting``; the two modules are its halves:

    frame.py   the frame layout, ``Frame``, ``decode_frame``, ``FrameError``, limits
    codes.py   ``RequestCode``, ``ResponseCode`` and ``RETRIABLE``
"""

from protocol.remoting.codes import RETRIABLE, RequestCode, ResponseCode
from protocol.remoting.frame import (
    DEFAULT_MAX_FRAME,
    MAX_CODE,
    MAX_EXT_ITEMS,
    MAX_OPAQUE,
    REFUSED_HEADER,
    VERSION,
    ExtScalar,
    ExtValue,
    Frame,
    FrameError,
    FrameFlag,
    decode_frame,
)

__all__ = [
    "DEFAULT_MAX_FRAME",
    "MAX_CODE",
    "MAX_EXT_ITEMS",
    "MAX_OPAQUE",
    "REFUSED_HEADER",
    "RETRIABLE",
    "VERSION",
    "ExtScalar",
    "ExtValue",
    "Frame",
    "FrameError",
    "FrameFlag",
    "RequestCode",
    "ResponseCode",
    "decode_frame",
]
