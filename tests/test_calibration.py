"""Calibration / evaluation image sampling and the CalibrationDataReader that feeds quantize_static."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import cv2
import numpy as np
import pytest

from app.imaging.preprocess import preprocess
from app.toolchain.calibration import ImageCalibrationReader, list_images, sample_directory

SIZES = {"a_class": 2, "b_class": 5, "c_class": 10}


def _image(seed: int, ext: str = ".png", shape: tuple[int, int] = (12, 16)) -> bytes:
    rng = np.random.default_rng(seed)
    ok, buf = cv2.imencode(ext, rng.integers(0, 256, size=(*shape, 3), dtype=np.uint8))
    assert ok
    return buf.tobytes()


@pytest.fixture
def class_tree(tmp_path: Path) -> Path:
    """Three class folders of 2, 5 and 10 images (one JPEG, one upper-case suffix), plus files to ignore."""
    root = tmp_path / "images"
    seed = 0
    for label, n in SIZES.items():
        (root / label).mkdir(parents=True)
        for i in range(n):
            ext, name = ".png", f"{i:02d}.png"
            if label == "c_class" and i == 0:
                ext, name = ".jpg", "00.jpg"
            elif label == "c_class" and i == 1:
                name = "01.PNG"
            (root / label / name).write_bytes(_image(seed, ext))
            seed += 1
        (root / label / "notes.txt").write_text("not an image")
    (root / "b_class" / "deeper").mkdir()  # a nested folder counts towards its top-level class
    (root / "b_class" / "04.png").rename(root / "b_class" / "deeper" / "04.png")
    return root


def test_list_images_groups_by_top_level_folder(class_tree):
    groups = list_images(class_tree)
    assert {k: len(v) for k, v in groups.items()} == SIZES
    assert all(p.suffix.lower() in (".png", ".jpg") for v in groups.values() for p in v)


@pytest.mark.parametrize(("n", "expected"), [(3, (1, 1, 1)), (6, (2, 2, 2)), (7, (2, 3, 2)), (9, (2, 4, 3))])
def test_classes_are_sampled_evenly(class_tree, n, expected):
    picked = sample_directory(class_tree, n)
    assert len(picked) == n
    assert len({p.path for p in picked}) == n
    counts = Counter(p.label for p in picked)
    assert tuple(counts[label] for label in SIZES) == expected
    for p in picked:
        assert p.path.is_file() and p.path.relative_to(class_tree).parts[0] == p.label


def test_small_classes_are_used_up_before_big_ones_take_more(class_tree):
    """9 from (2, 5, 10): all of the 2-image class, the other 7 split 4/3 between the others."""
    counts = Counter(p.label for p in sample_directory(class_tree, 9))
    assert counts["a_class"] == 2
    assert abs(counts["b_class"] - counts["c_class"]) <= 1


def test_asking_for_more_than_there_are_gives_all(class_tree):
    picked = sample_directory(class_tree, 100)
    assert len(picked) == 17
    assert {p.path for p in picked} == {p for v in list_images(class_tree).values() for p in v}
    assert sample_directory(class_tree, 0) == []


def test_seed_is_deterministic_and_changes_the_order(class_tree):
    a, b, c = (sample_directory(class_tree, 17, seed=s) for s in (7, 7, 8))
    assert a == b
    assert [p.path for p in a] != [p.path for p in c]
    assert {p.path for p in a} == {p.path for p in c}
    # the choice within a class depends on the seed too, not only the order
    firsts = {sample_directory(class_tree, 3, seed=s)[2].path for s in range(8)}
    assert len(firsts) > 1


def test_flat_directory(tmp_path):
    for i in range(4):
        (tmp_path / f"img{i}.png").write_bytes(_image(i))
    picked = sample_directory(tmp_path, 3)
    assert len(picked) == 3 and {p.label for p in picked} == {None}
    assert len(sample_directory(tmp_path, 10)) == 4


def test_images_at_the_top_next_to_class_folders_form_their_own_group(tmp_path):
    (tmp_path / "cat").mkdir()
    for i in range(3):
        (tmp_path / "cat" / f"{i}.png").write_bytes(_image(i))
        (tmp_path / f"loose{i}.png").write_bytes(_image(10 + i))
    counts = Counter(p.label for p in sample_directory(tmp_path, 4))
    assert counts == {"cat": 2, None: 2}


def test_empty_missing_and_imageless_directories_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="no images"):
        sample_directory(tmp_path, 4)
    (tmp_path / "readme.txt").write_text("x")
    (tmp_path / "sub").mkdir()
    with pytest.raises(FileNotFoundError, match="no images"):
        sample_directory(tmp_path, 4)
    with pytest.raises(FileNotFoundError, match="not found"):
        sample_directory(tmp_path / "missing", 4)
    with pytest.raises(FileNotFoundError, match="not found"):
        sample_directory(tmp_path / "readme.txt", 4)  # a file is not a directory


def test_reader_yields_batches_and_rewinds():
    images = [_image(i, shape=(40 + i, 30 + 2 * i)) for i in range(5)]
    reader = ImageCalibrationReader(images, "image", size=64, batch_size=2)
    assert len(reader) == 5
    batches = []
    while (batch := reader.get_next()) is not None:
        batches.append(batch)
    assert [list(b) for b in batches] == [["image"]] * 3
    assert [b["image"].shape for b in batches] == [(2, 64, 64, 3), (2, 64, 64, 3), (1, 64, 64, 3)]
    assert all(b["image"].dtype == np.uint8 for b in batches)
    assert reader.get_next() is None  # stays exhausted until rewound
    # the same pipeline the server uses
    np.testing.assert_array_equal(np.concatenate([b["image"] for b in batches]), [preprocess(b, 64) for b in images])
    reader.rewind()
    again = reader.get_next()
    assert again is not None
    np.testing.assert_array_equal(again["image"], batches[0]["image"])


def test_reader_default_size_matches_the_model_input():
    reader = ImageCalibrationReader([_image(0)], "x")
    batch = reader.get_next()
    assert batch is not None and batch["x"].shape == (1, 224, 224, 3) and batch["x"].dtype == np.uint8
    assert reader.get_next() is None
