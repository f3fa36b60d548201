"""The bounded multipart parser, pure."""

from __future__ import annotations

import httpx
import pytest

from app.errors import ServiceError
from app.http.multipart import boundary_of, parse_multipart


def encode(files: list[tuple[str, bytes, str]], fields: dict[str, str] | None = None) -> tuple[bytes, str]:
    req = httpx.Request("POST", "http://x/", files=[("file", (n, d, t)) for n, d, t in files], data=fields or {})
    return req.read(), req.headers["content-type"]


def test_parses_what_a_real_client_sends() -> None:
    body, ctype = encode(
        [("a.jpg", b"\xff\xd8abc", "image/jpeg"), ("b.png", b"\x89PNG\r\n\x1a\n--x", "image/png")], {"note": "hi"}
    )
    parts = parse_multipart(body, ctype, max_parts=10)
    files = [p for p in parts if p.name == "file"]
    assert [(p.filename, p.content_type, p.data) for p in files] == [
        ("a.jpg", "image/jpeg", b"\xff\xd8abc"),
        ("b.png", "image/png", b"\x89PNG\r\n\x1a\n--x"),
    ]
    assert any(p.name == "note" and p.data == b"hi" for p in parts)


def test_binary_data_containing_crlf_and_dashes_survives() -> None:
    payload = bytes(range(256)) * 4 + b"\r\n--\r\n"
    body, ctype = encode([("x.bin", payload, "application/octet-stream")])
    assert parse_multipart(body, ctype, 4)[0].data == payload


def test_preamble_is_skipped() -> None:
    body, ctype = encode([("a.jpg", b"data", "image/jpeg")])
    assert parse_multipart(b"x" * 100_000 + b"\r\n" + body, ctype, 4)[0].data == b"data"


@pytest.mark.parametrize(
    "body, ctype, code",
    [
        (b"whatever", "multipart/form-data", "bad_multipart"),  # no boundary parameter
        (b"no delimiter here", "multipart/form-data; boundary=abc", "bad_multipart"),
        (
            b"--abc\r\nContent-Disposition: form-data; name=file\r\n\r\ndata",
            "multipart/form-data; boundary=abc",
            "bad_multipart",
        ),  # never closed
        (b"--abcXYZ", "multipart/form-data; boundary=abc", "bad_multipart"),
        (b"--abc\r\nno separator\r\n--abc--", "multipart/form-data; boundary=abc", "bad_multipart"),
    ],
)
def test_malformed_bodies_are_refused(body: bytes, ctype: str, code: str) -> None:
    with pytest.raises(ServiceError) as e:
        parse_multipart(body, ctype, 4)
    assert e.value.code == code and e.value.status == 400


def test_part_count_is_bounded() -> None:
    body, ctype = encode([(f"{i}.jpg", b"d", "image/jpeg") for i in range(5)])
    with pytest.raises(ServiceError) as e:
        parse_multipart(body, ctype, max_parts=3)
    assert e.value.code == "too_many_files" and e.value.status == 413


def test_boundary_quoted() -> None:
    assert boundary_of('multipart/form-data; boundary="a b"') == b"a b"
