"""Agent protocol framing: pure functions, no Docker, no processes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rlsandbox.daemon.agent import protocol as p
from rlsandbox.daemon.model import ExecRequest, FileWrite


def test_round_trip_single_frame() -> None:
    frame = p.encode_frame(p.K_EXEC, 7, b'{"a":1}', b"\x00\xff body")
    assert p.FrameDecoder().feed(frame) == [(p.K_EXEC, 7, b'{"a":1}', b"\x00\xff body")]


def test_partial_reads_byte_by_byte() -> None:
    frames = [p.encode_frame(p.K_STDOUT, i, b"{}", bytes([i]) * i) for i in range(1, 40)]
    stream = b"".join(frames)
    dec = p.FrameDecoder()
    got = []
    for i in range(len(stream)):
        got += dec.feed(stream[i : i + 1])
    assert [(k, rid, body) for k, rid, _, body in got] == [(p.K_STDOUT, i, bytes([i]) * i) for i in range(1, 40)]
    assert dec.buffered == 0


def test_many_frames_in_one_read() -> None:
    stream = b"".join(p.encode_frame(p.K_RESULT, i, b"{}", b"x") for i in range(1000))
    assert [rid for _, rid, _, _ in p.FrameDecoder().feed(stream)] == list(range(1000))


def test_binary_and_invalid_utf8_bodies_pass_untouched() -> None:
    body = bytes(range(256)) * 10 + b"\xc3\x28\xa0\xa1"
    assert p.FrameDecoder().feed(p.encode_frame(p.K_STDOUT, 1, b"{}", body))[0][3] == body


def test_large_payload() -> None:
    body = b"\xab" * (20 << 20)
    frame = p.encode_frame(p.K_WRITE_FILES, 3, b"{}", body)
    dec = p.FrameDecoder()
    out = []
    for i in range(0, len(frame), 1 << 16):
        out += dec.feed(frame[i : i + (1 << 16)])
    assert len(out) == 1 and out[0][3] == body


def test_unknown_version_is_skipped_and_reported_without_losing_neighbours() -> None:
    good1 = p.encode_frame(p.K_RESULT, 1, b"{}", b"a")
    future = bytearray(p.encode_frame(p.K_RESULT, 2, b"{}", b"b"))
    future[2] = 99  # version byte
    good3 = p.encode_frame(p.K_RESULT, 3, b"{}", b"c")
    dec = p.FrameDecoder()
    with pytest.raises(p.UnsupportedVersion) as info:
        dec.feed(good1 + bytes(future) + good3)
    assert info.value.version == 99 and info.value.request_id == 2
    assert [rid for _, rid, _, _ in info.value.frames] == [1, 3]  # type: ignore[attr-defined]
    assert dec.buffered == 0
    assert dec.feed(p.encode_frame(p.K_RESULT, 4)) == [(p.K_RESULT, 4, b"{}", b"")]


def test_bad_magic_is_a_protocol_error() -> None:
    with pytest.raises(p.ProtocolError, match="magic"):
        p.FrameDecoder().feed(b"GARBAGE-GARBAGE-GARBAGE")


def test_oversized_frame_is_rejected_before_buffering() -> None:
    header = p.HEADER.pack(b"RX", p.PROTOCOL_VERSION, p.K_EXEC, 1, 2, p.MAX_BODY + 1)
    with pytest.raises(p.ProtocolError, match="too large"):
        p.FrameDecoder().feed(header)
    with pytest.raises(p.ProtocolError, match="too large"):
        p.encode_frame(p.K_EXEC, 1, b"x" * (p.MAX_META + 1))


def test_header_layout_is_stable() -> None:
    # The agent inside old images and a newer daemon must agree on this forever.
    assert p.HEADER.size == 16
    assert p.encode_frame(1, 2, b"{}", b"z")[:16] == struct.pack(">2sBBIII", b"RX", 1, 1, 2, 2, 1)


def test_exec_request_and_result_codecs() -> None:
    meta, body = p.exec_request(ExecRequest(argv=("ls", "-l"), cwd="/w", env={"A": "1"}, stdin=b"in", timeout=3), stream=False)
    assert meta["argv"] == ["ls", "-l"] and meta["cwd"] == "/w" and meta["env"] == {"A": "1"} and body == b"in"
    result = p.exec_result({"exit_code": 2, "stdout_len": 3, "stdout_total": 9, "stdout_truncated": True}, b"outerr")
    assert (result.stdout, result.stderr, result.exit_code, result.stdout_truncated) == (b"out", b"err", 2, True)


def test_write_and_read_files_codecs() -> None:
    meta, body = p.write_files_request([FileWrite("/a", b"12"), FileWrite("/b", b"", 0o755), FileWrite("/c", b"345")])
    assert [f["size"] for f in meta["files"]] == [2, 0, 3] and body == b"12345"
    reads = p.read_files_result(
        {
            "files": [
                {"path": "/a", "ok": True, "length": 2, "size": 10, "truncated": True},
                {"path": "/x", "ok": False, "error": "No such file"},
                {"path": "/c", "ok": True, "length": 3},
            ]
        },
        b"12345",
    )
    assert [(r.data, r.truncated, r.error) for r in reads] == [
        (b"12", True, None),
        (b"", False, "No such file"),
        (b"345", False, None),
    ]


def test_meta_must_be_an_object() -> None:
    with pytest.raises(p.ProtocolError):
        p.loads(b"[1,2]")


@given(chunks=st.lists(st.binary(max_size=300), max_size=20), prefix=st.booleans())
def test_decoder_fuzz_only_frames_or_protocol_errors(chunks: list[bytes], prefix: bool) -> None:
    """Random bytes, alone or after a valid frame, split anywhere: the decoder returns frames or
    raises ProtocolError (a typed error the channel turns into a dead sandbox), nothing else."""
    dec = p.FrameDecoder()
    stream = [p.encode_frame(p.K_EXEC, 1, b"{}", b"x")] if prefix else []
    try:
        for chunk in [*stream, *chunks]:
            for kind, rid, meta, body in dec.feed(chunk):
                assert isinstance(kind, int) and isinstance(rid, int)
                assert isinstance(meta, bytes) and isinstance(body, bytes)
    except p.ProtocolError:
        pass


@given(meta=st.binary(max_size=200))
def test_meta_fuzz_is_a_dict_or_protocol_error(meta: bytes) -> None:
    try:
        assert isinstance(p.loads(meta), dict)
    except p.ProtocolError:
        pass


def _keyed_pair() -> tuple[p.FrameSealer, p.FrameDecoder]:
    key = bytes(range(32))
    decoder = p.FrameDecoder()
    decoder.authenticate(key, p.TO_AGENT)
    return p.FrameSealer(key, p.TO_AGENT), decoder


def test_keyed_frames_round_trip_in_any_slicing() -> None:
    sealer, decoder = _keyed_pair()
    stream = b"".join(p.encode_frame(p.K_EXEC, i, b'{"i":%d}' % i, bytes([i]) * i, sealer) for i in range(1, 30))
    got = []
    for i in range(0, len(stream), 7):
        got += decoder.feed(stream[i : i + 7])
    assert [(rid, body) for _, rid, _, body in got] == [(i, bytes([i]) * i) for i in range(1, 30)]


def test_every_changed_byte_of_a_keyed_frame_is_caught() -> None:
    key = b"k" * 32
    frame = p.encode_frame(p.K_RESULT, 3, b'{"exit_code":1}', b"out", p.FrameSealer(key, p.TO_DAEMON))
    for i in range(len(frame)):
        bad = bytearray(frame)
        bad[i] ^= 0x01
        decoder = p.FrameDecoder()
        decoder.authenticate(key, p.TO_DAEMON)
        with pytest.raises(p.ProtocolError):
            decoder.feed(bytes(bad))


def test_a_keyed_stream_catches_frames_dropped_added_replayed_or_from_the_other_direction() -> None:
    key = b"k" * 32
    sealer = p.FrameSealer(key, p.TO_DAEMON)
    frames = [p.encode_frame(p.K_RESULT, i, b"{}", b"", sealer) for i in range(3)]
    other = p.encode_frame(p.K_RESULT, 9, b"{}", b"", p.FrameSealer(key, p.TO_AGENT))
    plain = p.encode_frame(p.K_RESULT, 1, b'{"exit_code": 0, "signal": null}')
    for stream in (frames[0] + frames[2], frames[0] + frames[0], other, plain + frames[0], frames[0] + plain):
        decoder = p.FrameDecoder()
        decoder.authenticate(key, p.TO_DAEMON)
        with pytest.raises(p.Tampered):
            decoder.feed(stream)
    decoder = p.FrameDecoder()
    decoder.authenticate(key, p.TO_DAEMON)
    assert [rid for _, rid, _, _ in decoder.feed(b"".join(frames))] == [0, 1, 2]


def test_a_forged_header_is_caught_before_its_lengths_are_believed() -> None:
    """A header claiming a 200 MB body would otherwise swallow every real frame behind it."""
    sealer, decoder = _keyed_pair()
    forged = p.HEADER.pack(b"RX", p.PROTOCOL_VERSION, p.K_EXEC, 1, 2, 200 << 20) + b"x" * p.TAG_SIZE
    with pytest.raises(p.Tampered, match="forged or cut header"):
        decoder.feed(forged + p.encode_frame(p.K_PING, 2, b"{}", b"", sealer))


def test_an_unkeyed_decoder_stops_behind_a_key_frame() -> None:
    """The frames behind KEY are tagged: they wait until the reader has keyed its decoder."""
    key = b"k" * 32
    stream = p.encode_frame(p.K_KEY, 1, b'{"key":"%s"}' % key.hex().encode()) + p.encode_frame(
        p.K_PING, 2, b"{}", b"", p.FrameSealer(key, p.TO_AGENT)
    )
    decoder = p.FrameDecoder()
    assert [kind for kind, *_ in decoder.feed(stream)] == [p.K_KEY]
    decoder.authenticate(key, p.TO_AGENT)
    assert [(kind, rid) for kind, rid, _, _ in decoder.feed(b"")] == [(p.K_PING, 2)]
