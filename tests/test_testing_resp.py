"""The RESP framer under the fault proxy: whole values out, however the bytes were chunked."""

from __future__ import annotations

import hiredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiolock.testing._resp import RespFramer, is_push, parse_request


def bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(bulk(arg) for arg in args)


# RESP2 and RESP3 values, encoded: the framer must hand each back byte for byte.
_line = st.binary(max_size=20).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_scalars = st.one_of(
    _line.map(lambda s: b"+" + s + b"\r\n"),
    _line.map(lambda s: b"-ERR " + s + b"\r\n"),
    st.integers(-(2**63), 2**63 - 1).map(lambda n: b":%d\r\n" % n),
    st.binary(max_size=300).map(bulk),
    st.just(b"$-1\r\n"),
    st.just(b"*-1\r\n"),
    st.just(b"_\r\n"),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: b",%r\r\n" % f),
    st.booleans().map(lambda t: b"#t\r\n" if t else b"#f\r\n"),
    st.integers().map(lambda n: b"(%d\r\n" % n),
    st.binary(max_size=50).map(lambda b: b"=%d\r\ntxt:%s\r\n" % (len(b) + 4, b)),
    st.binary(max_size=50).map(lambda b: b"!%d\r\n%s\r\n" % (len(b), b)),
)


def _aggregate(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    items = st.lists(children, max_size=5)
    pairs = st.lists(st.tuples(children, children), max_size=3)
    return st.one_of(
        items.map(lambda xs: b"*%d\r\n" % len(xs) + b"".join(xs)),
        items.map(lambda xs: b"~%d\r\n" % len(xs) + b"".join(xs)),
        items.map(lambda xs: b">%d\r\n" % len(xs) + b"".join(xs)),
        pairs.map(lambda ps: b"%%%d\r\n" % len(ps) + b"".join(k + v for k, v in ps)),
        st.tuples(pairs, children).map(
            lambda a: b"|%d\r\n" % len(a[0]) + b"".join(k + v for k, v in a[0]) + a[1]
        ),
    )


resp_values = st.recursive(_scalars, _aggregate, max_leaves=20)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(resp_values, min_size=1, max_size=8), data=st.data())
def test_framer_returns_each_value_whole_for_any_chunking(
    values: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(values)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    framer = RespFramer()
    frames: list[bytes] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        frames += framer.feed(stream[start:end])
    assert frames == values
    assert framer.buffered == 0
    assert not framer.broken


def test_values_split_byte_by_byte() -> None:
    stream = b"+OK\r\n" + bulk(b"x" * 70000) + b"*2\r\n:1\r\n$-1\r\n"
    framer = RespFramer()
    frames = [frame for i in range(len(stream)) for frame in framer.feed(stream[i : i + 1])]
    assert frames == [b"+OK\r\n", bulk(b"x" * 70000), b"*2\r\n:1\r\n$-1\r\n"]


def test_frames_agree_with_hiredis() -> None:
    """Each frame is exactly one value to a real RESP parser."""
    stream = b"".join(
        [command(b"SET", b"k", b"v" * 1000), b":7\r\n", b"*3\r\n$1\r\na\r\n*1\r\n+b\r\n:2\r\n"]
    )
    for frame in RespFramer().feed(stream):
        reader = hiredis.Reader()
        reader.feed(frame)
        assert reader.gets() is not False
        assert reader.gets() is False  # nothing left over


def test_inline_commands_on_the_request_side() -> None:
    framer = RespFramer(inline=True)
    assert framer.feed(b"PING\r\nECHO hi\r\n" + command(b"GET", b"k") + b"\r\nQUI") == [
        b"PING\r\n",
        b"ECHO hi\r\n",
        command(b"GET", b"k"),
        b"\r\n",
    ]
    assert framer.feed(b"T\n") == [b"QUIT\n"]


def test_not_resp_is_passed_on_raw() -> None:
    framer = RespFramer()
    assert framer.feed(b"+OK\r\nHTTP/1.1 200 OK\r\n") == [b"+OK\r\n"]
    assert framer.broken
    assert framer.feed(b"more") == []
    assert framer.take_raw() == b"HTTP/1.1 200 OK\r\nmore"
    assert framer.take_raw() == b""


@pytest.mark.parametrize("inline", [False, True])
def test_a_line_that_never_ends_is_passed_on_raw(inline: bool) -> None:
    framer = RespFramer(inline=inline)
    assert framer.feed(b"+" + b"x" * 65535) == []  # 64 KiB
    assert not framer.broken  # still waiting for the end of the line
    assert framer.feed(b"x") == []
    assert framer.broken
    assert framer.take_raw() == b"+" + b"x" * 65536


@pytest.mark.parametrize("bad", [b"$x\r\n", b"*1x\r\n", b"$3\r\nabcde\r\n", b"?\r\n"])
def test_malformed_lengths_break_the_framer(bad: bytes) -> None:
    framer = RespFramer()
    assert framer.feed(bad) == []
    assert framer.broken


def test_parse_request() -> None:
    assert parse_request(command(b"EVALSHA", b"abc", b"1", b"k")) == (
        b"EVALSHA",
        b"abc",
        b"1",
        b"k",
    )
    assert parse_request(command(b"SET", b"a\r\nb", b"")) == (b"SET", b"a\r\nb", b"")
    assert parse_request(b"ECHO  hi\r\n") == (b"ECHO", b"hi")
    assert parse_request(b"\r\n") == ()
    assert parse_request(b"*1\r\n:1\r\n") == ()  # not bulk strings: not a command


def test_is_push() -> None:
    assert is_push(b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n")
    assert not is_push(b"*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n")
