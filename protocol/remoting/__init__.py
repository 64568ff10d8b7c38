"""The wire: one frame per WebSocket message (``frame``, ``frame_decoder``) carrying a code (``codes``).

Importers use ``protocol.remoting``; its modules:

    frame.py           the frame layout, ``Frame``, ``FrameError``, limits, field checks
    frame_decoder.py   ``decode_frame``: bytes to a ``Frame``, bounded
    codes.py           ``RequestCode``, ``ResponseCode`` and ``RETRIABLE``
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
)
from protocol.remoting.frame_decoder import decode_frame

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
