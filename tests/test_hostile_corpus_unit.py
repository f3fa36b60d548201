"""The hostile corpus (tests/hostile.py), checked where it can be without HTTP: its own consistency,
and every case decided by the image bytes run through `preprocess` with the service's default limits.
The media-type, body-size and multipart cases belong to the Router and run in the HTTP tests."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest

from app.errors import STATUS, ImageInputError
from app.preprocess import DEFAULT_MAX_PIXELS, preprocess
from tests.hostile import DEFAULT_MAX_BODY_BYTES, HostileCase, hostile_cases

CASES = hostile_cases()
IMAGE_CASES = [c for c in CASES if c.layer == "preprocess"]


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
    ):
        assert codes[code] >= 1, code
    assert codes[""] >= 20  # odd-but-valid images
    assert sum(c.expected_code == "too_many_pixels" and c.layer == "preprocess" for c in CASES) >= 8
    too_big = [c for c in CASES if c.name == "body_11_mib"]
    assert too_big and len(too_big[0].body) > DEFAULT_MAX_BODY_BYTES


@pytest.mark.parametrize("case", IMAGE_CASES, ids=[c.name for c in IMAGE_CASES])
def test_image_case_through_preprocess(case: HostileCase) -> None:
    start = time.perf_counter()
    if case.expected_status == 200:
        out = preprocess(case.body, max_pixels=DEFAULT_MAX_PIXELS)
        assert out.dtype == np.uint8 and out.shape == (224, 224, 3)
        return
    with pytest.raises(ImageInputError) as info:
        preprocess(case.body, max_pixels=DEFAULT_MAX_PIXELS)
    assert info.value.code == case.expected_code, info.value.message
    assert info.value.status == case.expected_status
    if case.expected_code == "too_many_pixels" or "claims" in case.name:
        assert time.perf_counter() - start < 0.05, "bombs are refused from the header, before decoding"
