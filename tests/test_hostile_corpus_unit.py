"""The hostile corpus (tests/hostile.py), checked where it can be without HTTP: its own consistency,
and every case decided by the image bytes run through `preprocess` with the service's default limits.
The media-type, body-size and multipart cases belong to the Router and run in the HTTP tests."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from app.config import Limits
from app.errors import STATUS, ImageInputError
from app.imaging.decode_cost import DEFAULT_MAX_DECODE_BYTES
from app.imaging.preprocess import DEFAULT_MAX_PIXELS, check_header, cv2, preprocess
from tests.hostile import DEFAULT_MAX_BODY_BYTES, HostileCase, hostile_cases
from tests.test_preprocess import HEADER_BYTES, CountedReads

CASES = hostile_cases()
IMAGE_CASES = [c for c in CASES if c.layer == "preprocess"]
# Verdicts given from the header alone: the decoder never runs for these.
HEADER_VERDICTS = ("too_many_pixels", "decode_budget_exceeded", "unsupported_image")


def test_corpus_shape() -> None:
    assert len(CASES) >= 30
    names = Counter(c.name for c in CASES)
    assert not [n for n, k in names.items() if k > 1], "case names must be unique"
    for c in CASES:
        assert c.kind in ("raw", "multipart", "raw_body"), c
        assert c.layer in ("router", "preprocess"), c
        if c.expected_status == 200:
            assert c.expected_code == "", c
        else:
            assert STATUS[c.expected_code] == c.expected_status, c
        if c.layer == "preprocess":
            assert c.kind == "raw", c  # image-byte cases are sent as the raw body
        if c.kind == "multipart" and "no_boundary" not in c.name:
            assert "boundary=" in c.content_type, c


def test_corpus_covers_the_brief() -> None:
    codes = Counter(c.expected_code for c in CASES)
    for code in (
        "empty_body",
        "undecodable_image",
        "too_many_pixels",
        "payload_too_large",
        "unsupported_media_type",
        "missing_file",
        "bad_multipart",
        "decode_budget_exceeded",
        "unsupported_image",
    ):
        assert codes[code] >= 1, code
    names = {c.name for c in CASES}
    for name in ("tiff_float32_rgba_bomb_6324x6324", "png_16bit_rgba_bomb_8000x5000", "tiff_16bit_rgb_planar"):
        assert name in names, name
    assert codes[""] >= 20  # odd-but-valid images
    assert sum(c.expected_code == "too_many_pixels" and c.layer == "preprocess" for c in CASES) >= 8
    too_big = [c for c in CASES if c.name == "body_11_mib"]
    assert too_big and len(too_big[0].body) > DEFAULT_MAX_BODY_BYTES


def _no_decoding(*args: object, **kwargs: object) -> None:
    raise AssertionError("the decoder must not run")


@pytest.mark.parametrize("case", IMAGE_CASES, ids=[c.name for c in IMAGE_CASES])
def test_image_case_through_preprocess(case: HostileCase, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the service's default limits (the corpus's statuses assume them)."""
    assert Limits().max_decode_bytes == DEFAULT_MAX_DECODE_BYTES and Limits().max_pixels == DEFAULT_MAX_PIXELS
    if case.expected_status == 200:
        out = preprocess(case.body, max_pixels=DEFAULT_MAX_PIXELS)
        assert out.dtype == np.uint8 and out.shape == (224, 224, 3)
        return
    bomb = case.expected_code == "too_many_pixels" or "claims" in case.name
    if case.expected_code in HEADER_VERDICTS or bomb:
        monkeypatch.setattr(cv2, "imdecode", _no_decoding)
        monkeypatch.setattr(cv2, "imdecodeWithMetadata", _no_decoding)
    body = CountedReads(case.body)
    with pytest.raises(ImageInputError) as info:
        preprocess(body, max_pixels=DEFAULT_MAX_PIXELS)
    assert info.value.code == case.expected_code, info.value.message
    assert info.value.status == case.expected_status
    if bomb:  # refused from the header, before decoding: no decoder ran, and a few hundred bytes were read at most
        assert body.bytes_read <= HEADER_BYTES, (body.reads, body.bytes_read, len(case.body))


@pytest.mark.parametrize("case", IMAGE_CASES, ids=[c.name for c in IMAGE_CASES])
def test_the_routers_header_check_gives_every_header_verdict(
    case: HostileCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Router runs `check_header` (the Preprocessor's own first step) on every path, /v1/classify, each
    file of /v1/classify/batch and each V2 BYTES element, before dispatch: every verdict the header alone
    gives is given there, without decoding, and what it lets through is left to the Preprocessor."""
    monkeypatch.setattr(cv2, "imdecode", _no_decoding)
    monkeypatch.setattr(cv2, "imdecodeWithMetadata", _no_decoding)
    try:
        check_header(case.body, DEFAULT_MAX_PIXELS, 224, DEFAULT_MAX_DECODE_BYTES)
    except ImageInputError as e:
        assert e.code == case.expected_code, e.message
        return
    assert case.expected_code not in (*HEADER_VERDICTS, "empty_body"), case.name
