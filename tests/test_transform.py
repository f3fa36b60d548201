"""The Preprocessor's half of a declaration (app/imaging/transform.py): squash, or shorter side then centre crop, in the
graph's channel order; torchvision's arithmetic, computed here by hand. Pure: OpenCV and numpy, no Ray."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from app.imaging.preprocess import preprocess
from app.imaging.transform import MAX_ASPECT, Transform


def bgr(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def png(img: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", img)
    assert ok
    return buf.tobytes()


def test_an_image_whose_shorter_side_is_resize_shorter_is_only_cropped_never_resampled() -> None:
    img = bgr(300, 451)  # landscape: the height is the shorter side
    out = Transform(240, 240, 3, 300, "cubic", "RGB").apply(img)
    top, left = round((300 - 240) / 2), round((451 - 240) / 2)  # torchvision's CenterCrop offsets
    np.testing.assert_array_equal(out, img[top : top + 240, left : left + 240, ::-1])
    portrait = bgr(451, 300, 1)
    out = Transform(240, 200, 3, 300, "area", "BGR").apply(portrait)
    top, left = round((451 - 240) / 2), round((300 - 200) / 2)
    np.testing.assert_array_equal(out, portrait[top : top + 240, left : left + 200])
    # the same through the whole decode, from a lossless PNG
    np.testing.assert_array_equal(
        preprocess(png(img), Transform(240, 240, 3, 300, "cubic", "RGB")), img[30:270, 106:346, ::-1]
    )


@pytest.mark.parametrize("interpolation", ["area", "linear", "cubic"])
def test_shorter_side_then_centre_crop_is_torchvisions_resize_then_centercrop(interpolation: str) -> None:
    img = bgr(375, 500)
    t = Transform(224, 224, 3, 256, interpolation, "RGB")
    new_w = int(256 * 500 / 375)  # torchvision: int(size * long / short)
    flag = {"area": cv2.INTER_AREA, "linear": cv2.INTER_LINEAR, "cubic": cv2.INTER_CUBIC}[interpolation]
    resized = cv2.resize(img, (new_w, 256), interpolation=flag)
    top, left = round((256 - 224) / 2), round((new_w - 224) / 2)
    np.testing.assert_array_equal(t.apply(img), resized[top : top + 224, left : left + 224, ::-1])


def test_squash_takes_the_whole_image_to_the_input_size() -> None:
    img = bgr(100, 300)
    out = Transform(32, 48, 3, None, "area", "BGR").apply(img)
    np.testing.assert_array_equal(out, cv2.resize(img, (48, 32), interpolation=cv2.INTER_AREA))
    up = Transform(32, 48, 3, None, "area", "BGR").apply(bgr(10, 10))  # area enlarges bilinearly
    np.testing.assert_array_equal(up, cv2.resize(bgr(10, 10), (48, 32), interpolation=cv2.INTER_LINEAR))
    assert Transform.square(224) == Transform(224, 224, 3, None, "area", "RGB")


def test_channel_orders() -> None:
    img = bgr(20, 20)
    same = Transform(20, 20, 3, None, "area", "BGR").apply(img)
    np.testing.assert_array_equal(Transform(20, 20, 3, None, "area", "RGB").apply(img), same[..., ::-1])
    grey = Transform(20, 20, 1, None, "area", "GRAY").apply(img)
    assert grey.shape == (20, 20, 1)
    np.testing.assert_array_equal(grey[..., 0], cv2.cvtColor(img, cv2.COLOR_BGR2GRAY))
    g = img[..., 0]  # a decoded grey image: one plane, whatever the order
    np.testing.assert_array_equal(Transform(20, 20, 1, None, "area", "GRAY").apply(g)[..., 0], g)
    assert Transform(20, 20, 3, None, "area", "RGB").apply(g).shape == (20, 20, 3)


def test_an_extreme_aspect_ratio_cannot_make_a_huge_intermediate() -> None:
    """A 1 x 100,000 image resized to a shorter side of 256 would be 25.6 M pixels wide; only the middle of its long
    side, MAX_ASPECT times its short side, is resized, and the crop is the same region as before."""
    thin = np.full((4, 100_000, 3), 7, np.uint8)
    out = Transform(224, 224, 3, 256, "area", "RGB").apply(thin)
    assert out.shape == (224, 224, 3) and (out == 7).all()
    kept = Transform(8, 8, 3, 8, "linear", "BGR")
    strip = bgr(8, 8 * MAX_ASPECT * 3)
    np.testing.assert_array_equal(kept.apply(strip), strip[:, 4 * 8 * MAX_ASPECT * 3 // 8 - 4 :][:, :8])


def test_decode_target_and_shape() -> None:
    assert Transform(224, 224, 3, 256, "cubic", "RGB").decode_target == 256
    assert Transform(100, 160).decode_target == 160 and Transform(100, 160).shape == (100, 160, 3)
    assert Transform.from_dict(Transform(28, 28, 1, 32, "area", "GRAY").to_dict()) == Transform(
        28, 28, 1, 32, "area", "GRAY"
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"height": 0, "width": 4},
        {"height": 4, "width": 4, "interpolation": "lanczos"},
        {"height": 4, "width": 4, "channels": 1, "color": "RGB"},
        {"height": 4, "width": 4, "channels": 3, "color": "GRAY"},
        {"height": 4, "width": 4, "channels": 2, "color": "RGB"},
        {"height": 4, "width": 8, "resize_shorter": 6},
    ],
)
def test_a_transform_that_cannot_be_is_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Transform(**kwargs)
