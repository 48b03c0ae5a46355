"""A small incremental RESP framer: cut a byte stream into whole RESP values, bytes untouched.

The proxy needs the exact bytes of each value (to forward, hold or drop it whole), which a
parser such as ``hiredis.Reader`` does not give back, so this module only finds where each value
ends. It knows RESP2 and RESP3 (``+ - : $ *`` and ``_ , # ( ! = % ~ > |``) and, for the
client -> server direction, inline commands (``PING\\r\\n``). Streamed RESP3 aggregates
(``$?``, ``*?``) are not sent by Redis and are not supported: a stream it cannot frame is
reported as :attr:`RespFramer.broken` and its bytes handed on raw.
"""

from __future__ import annotations

from typing import Final

_LINE_TYPES: Final = frozenset(b"+-:_,#(")
_BLOB_TYPES: Final = frozenset(b"$!=")
_AGGREGATE_TYPES: Final = frozenset(b"*~>")
_PAIR_TYPES: Final = frozenset(b"%|")
_ATTRIBUTE: Final = ord("|")
_PUSH: Final = ord(">")
_ARRAY: Final = ord("*")
_MAX_LINE: Final = 64 * 1024  # Redis refuses longer inline requests; no RESP header is that long


class RespError(ValueError):
    """The bytes are not RESP."""


def _length(buf: bytearray, start: int, end: int) -> int:
    text = bytes(buf[start:end])
    if not text or not text.lstrip(b"-").isdigit():
        raise RespError(f"bad length {text!r}")
    return int(text)


def _value_end(buf: bytearray, pos: int) -> int | None:
    """Index just past the RESP value that starts at ``pos``; ``None`` if it is incomplete."""
    line_end = buf.find(b"\r\n", pos)
    if line_end < 0:
        if len(buf) - pos > _MAX_LINE:
            raise RespError("no end of line in 64 KiB")
        return None
    kind = buf[pos]
    if kind in _LINE_TYPES:
        return line_end + 2
    if kind in _BLOB_TYPES:
        length = _length(buf, pos + 1, line_end)
        if length < 0:  # RESP2 null bulk string / array
            return line_end + 2
        end = line_end + 2 + length + 2
        if end > len(buf):
            return None
        if buf[end - 2 : end] != b"\r\n":
            raise RespError("blob string not followed by CRLF")
        return end
    if kind in _AGGREGATE_TYPES or kind in _PAIR_TYPES:
        count = _length(buf, pos + 1, line_end)
        if kind in _PAIR_TYPES:
            count *= 2
        next_pos: int | None = line_end + 2
        for _ in range(max(count, 0)):
            assert next_pos is not None
            next_pos = _value_end(buf, next_pos)
            if next_pos is None:
                return None
        if kind == _ATTRIBUTE:  # attributes prefix the value they describe: one frame
            assert next_pos is not None
            return _value_end(buf, next_pos)
        return next_pos
    raise RespError(f"unknown RESP type byte {bytes([kind])!r}")


class RespFramer:
    """Feed bytes, get back the complete RESP values among them (each as its exact bytes).

    Incomplete data is kept until the rest arrives. With ``inline=True`` (the client -> server
    direction) a line that does not start with ``*`` is an inline command, as Redis reads it.
    On data that is not RESP, :attr:`broken` is set: the values before it are still returned,
    and from then on :meth:`feed` returns nothing and :meth:`take_raw` hands out the bytes.
    """

    def __init__(self, *, inline: bool = False) -> None:
        self._inline = inline
        self._buf = bytearray()
        self.broken = False

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return the values completed by it, in order."""
        self._buf += data
        if self.broken:
            return []
        frames: list[bytes] = []
        pos = 0
        buf = self._buf
        try:
            while pos < len(buf):
                if self._inline and buf[pos] != _ARRAY:
                    newline = buf.find(b"\n", pos)
                    if newline < 0 and len(buf) - pos > _MAX_LINE:
                        raise RespError("inline request longer than 64 KiB")
                    end: int | None = None if newline < 0 else newline + 1
                else:
                    end = _value_end(buf, pos)
                if end is None:
                    break
                frames.append(bytes(buf[pos:end]))
                pos = end
        except (RespError, RecursionError):
            self.broken = True
        del buf[:pos]
        return frames

    def take_raw(self) -> bytes:
        """Once :attr:`broken`: the bytes received since, which are not framed."""
        if not self.broken:
            return b""
        raw = bytes(self._buf)
        self._buf.clear()
        return raw

    @property
    def buffered(self) -> int:
        """Bytes held back: an incomplete value (or, once broken, raw bytes not taken yet)."""
        return len(self._buf)


def is_push(frame: bytes) -> bool:
    """True for a RESP3 push (an out-of-band message, not the reply to a request)."""
    return frame[:1] == bytes([_PUSH])


def parse_request(frame: bytes) -> tuple[bytes, ...]:
    """The arguments of one request frame (a RESP array of bulk strings, or an inline command).

    Returns ``()`` for an empty inline line (Redis ignores it and sends no reply) and for
    anything else it cannot read as a command.
    """
    if frame[:1] != b"*":
        return tuple(frame.split())
    buf = bytearray(frame)
    try:
        line_end = buf.index(b"\r\n")
        count = _length(buf, 1, line_end)
        parts: list[bytes] = []
        pos = line_end + 2
        for _ in range(count):
            if buf[pos] != ord("$"):
                return ()
            line_end = buf.index(b"\r\n", pos)
            length = _length(buf, pos + 1, line_end)
            start = line_end + 2
            parts.append(bytes(buf[start : start + length]))
            pos = start + length + 2
    except (ValueError, IndexError):  # RespError is a ValueError
        return ()
    return tuple(parts)
