"""The declared transform as an ONNX graph (app/runtime/transform_graph.py, for images decoded on the GPU) against the
CPU path (app/imaging/), on ONNX Runtime's CPU EP. Pure: no Ray.

The varied set: the sample photographs, augmented crops of them, and photographs squashed to odd sizes (portrait,
landscape, square, smaller than the crop, beyond MAX_ASPECT, 1 x 1), as PNG and JPEG. Apart: the photographs enlarged
and saved as JPEG, which `preprocess` decodes reduced (1/2, 1/4, 1/8) where the GPU decodes them whole."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from app.imaging.opencv import cv2
from app.imaging.preprocess import preprocess
from app.imaging.transform import MAX_ASPECT, Transform
from app.runtime import cpu_engine, softmax
from app.runtime.transform_graph import GraphTransform, transform_graph
from app.served_model import BUILTIN_MODEL, builtin_transform, default_files
from app.served_model.declaration import ModelDeclaration
from app.served_model.model_io import transform_for
from app.served_model.prologue import served_model
from app.toolchain.samples import augmented_samples, available_photos, sample_bytes

REPO = Path(__file__).resolve().parent.parent
AUGMENTED = 175  # with the rest, >= 200 images: one top-1 disagreement in 200 is 99.5%
ENLARGED = (600, 1100, 2100)  # shorter sides of the JPEG copies: decoded reduced 1/2, 1/4, 1/8 for a 256 target
ODD_SIZES = [(1, 1), (5, 9), (64, 48), (150, 113), (113, 150), (224, 224), (255, 257), (256, 256), (256, 300),
             (333, 777), (777, 333), (97, 1013), (2001, 301), (480, 640), (641, 479), (300, 256)]  # fmt: skip
Classify = Callable[[np.ndarray], np.ndarray]
TRANSFORMS = {
    "builtin": builtin_transform(),  # shorter side 256, centre 224, cubic, RGB
    "linear_bgr_240x200": Transform(240, 200, 3, 260, "linear", "BGR"),
    "area_gray_64": Transform(64, 64, 1, 72, "area", "GRAY"),
    "squash_area_bgr_96x128": Transform(96, 128, 3, None, "area", "BGR"),
    "squash_cubic_160x192": Transform(160, 192, 3, None, "cubic", "RGB"),
}


@dataclass(frozen=True)
class Sample:
    name: str
    data: bytes  # what a client sends
    bgr: np.ndarray  # its full-size decode, as OpenCV makes it

    @property
    def rgb(self) -> np.ndarray:
        """What nvImageCodec hands over."""
        return cv2.cvtColor(self.bgr, cv2.COLOR_BGR2RGB)


def _decode(data: bytes) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert img is not None
    return img


def _encode(img: np.ndarray, ext: str) -> bytes:
    ok, buf = cv2.imencode(ext, img, [cv2.IMWRITE_JPEG_QUALITY, 92] if ext == ".jpg" else [])
    assert ok
    return buf.tobytes()


@pytest.fixture(scope="module")
def photos() -> dict[str, np.ndarray]:
    names = available_photos()
    if not names:
        pytest.skip("no sample photographs here (scikit-image and matplotlib bundle them)")
    return {name: _decode(sample_bytes(name)) for name in names}


@pytest.fixture(scope="module")
def varied(photos: dict[str, np.ndarray]) -> list[Sample]:
    names = list(photos)
    raw = [(name, sample_bytes(name)) for name in names]
    raw += [(f"augmented_{i}", data) for i, data in enumerate(augmented_samples(AUGMENTED, seed=7))]
    for i, (h, w) in enumerate(ODD_SIZES):
        name, ext = names[i % len(names)], (".jpg" if i % 2 else ".png")
        img = cv2.resize(photos[name], (w, h), interpolation=cv2.INTER_AREA)
        raw.append((f"{name}_{h}x{w}{ext}", _encode(img, ext)))
    return [Sample(name, data, _decode(data)) for name, data in raw]


@pytest.fixture(scope="module")
def enlarged(photos: dict[str, np.ndarray]) -> list[Sample]:
    out = []
    for name, img in photos.items():
        for short in ENLARGED:
            f = short / min(img.shape[:2])
            big = cv2.resize(img, (round(img.shape[1] * f), round(img.shape[0] * f)), interpolation=cv2.INTER_CUBIC)
            data = _encode(big, ".jpg")
            out.append(Sample(f"{name}_{short}.jpg", data, _decode(data)))
    return out


@pytest.fixture(scope="module")
def graph_pixels() -> Callable[[str, Sample], np.ndarray]:
    """(transform's key, sample) -> the graph's pixels uint8 [1, H, W, C], each computed once (cubic is slow on CPU)."""
    graphs: dict[str, GraphTransform] = {}
    memo: dict[tuple[str, str], np.ndarray] = {}

    def pixels(key: str, s: Sample) -> np.ndarray:
        if (key, s.name) not in memo:
            graph = graphs.setdefault(key, GraphTransform(TRANSFORMS[key], options=_one_thread()))
            memo[key, s.name] = graph(s.rgb)
        return memo[key, s.name]

    return pixels


def _one_thread() -> ort.SessionOptions:
    """One thread, not spinning: the CI machine's few cores are shared (ORT's default, a spinning thread per core, was
    twice as slow there)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def _mad(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def _names(samples: list[Sample], which: np.ndarray) -> list[str]:
    return [s.name for s, yes in zip(samples, which, strict=True) if yes]


@pytest.fixture(scope="module")
def builtin_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Classify]:
    """The built-in FP32 model as served, on the CPU EP: uint8 pixels [N, 224, 224, 3] -> probabilities."""
    fp32 = default_files(REPO / "models").fp32
    if not fp32.is_file():
        pytest.skip(f"{fp32} is absent: `make models` builds it")
    declaration = ModelDeclaration(**BUILTIN_MODEL)
    served = served_model(fp32, declaration.preprocess, cache=tmp_path_factory.mktemp("served"))
    assert transform_for(declaration, served.graph) == TRANSFORMS["builtin"]
    engine = cpu_engine(served.path)

    def classify(pixels: np.ndarray) -> np.ndarray:
        return softmax(np.concatenate([engine.logits(pixels[i : i + 32]) for i in range(0, len(pixels), 32)]))

    yield classify
    engine.close()


def test_graph_is_valid_onnx_with_dynamic_height_and_width() -> None:
    for t in TRANSFORMS.values():
        model = transform_graph(t)
        onnx.checker.check_model(model, full_check=True)
        dims = model.graph.input[0].type.tensor_type.shape.dim
        assert [d.dim_param or d.dim_value for d in dims] == ["height", "width", 3]
    with pytest.raises(ValueError, match="opset 18"):
        transform_graph(builtin_transform(), opset=17)
    with pytest.raises(ValueError, match="RGB uint8"):
        GraphTransform(builtin_transform())(np.zeros((8, 8, 3), np.float32))


def test_an_image_whose_shorter_side_is_resize_shorter_is_only_cropped_and_a_long_one_cut_to_max_aspect() -> None:
    rng = np.random.default_rng(3)
    for t in (builtin_transform(), Transform(240, 200, 3, 256, "area", "BGR")):
        graph = GraphTransform(t, options=_one_thread())
        for h, w in [(256, 391), (391, 256), (256, 256), (64, 64 * MAX_ASPECT + 37), (64 * MAX_ASPECT + 9, 70)]:
            bgr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            got = graph(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))[0]
            if min(h, w) == t.resize_shorter:  # no resampling: exactly the CPU path's crop
                np.testing.assert_array_equal(got, t.apply(bgr))
            else:
                assert _mad(got, t.apply(bgr)) <= 1.0, (t, h, w)


@pytest.mark.slow
@pytest.mark.parametrize("key", TRANSFORMS)
def test_graph_matches_the_cpu_geometry_on_the_same_full_decode(
    key: str, varied: list[Sample], graph_pixels: Callable[[str, Sample], np.ndarray]
) -> None:
    t = TRANSFORMS[key]
    diffs = []
    # The built-in declaration on the whole set (the agreement test reuses its pixels); the others, whose graphs
    # differ only in their parameters, on every fourth image of it (CI's time: ORT's CPU cubic is slow).
    for s in varied if key == "builtin" else varied[::4]:
        got = graph_pixels(key, s)
        assert got.dtype == np.uint8 and got.shape == (1, *t.shape), (s.name, got.shape)
        diffs.append(_mad(got[0], t.apply(s.bgr)))
    d = np.asarray(diffs)
    worst = varied[int(d.argmax())].name
    figures = f"{key}: n={len(d)}, per-image mean |graph - CPU| mean {d.mean():.3f}, max {d.max():.3f} ({worst})"
    print(figures)
    assert d.max() <= 1.0, figures


@pytest.mark.slow
def test_top1_agrees_with_the_real_cpu_path(
    varied: list[Sample], graph_pixels: Callable[[str, Sample], np.ndarray], builtin_model: Classify
) -> None:
    """The issue's criterion: the graph on the full decode against `preprocess` (a JPEG at least twice the target
    decoded reduced), as the built-in FP32 model classifies them on the CPU EP: top-1 agreement >= 99.5%."""
    t = TRANSFORMS["builtin"]
    cpu = np.stack([preprocess(s.data, t) for s in varied])
    gpu = np.concatenate([graph_pixels("builtin", s) for s in varied])
    agree = builtin_model(cpu).argmax(1) == builtin_model(gpu).argmax(1)
    d = np.asarray([_mad(a, b) for a, b in zip(cpu, gpu, strict=True)])
    reduced = sum(min(s.bgr.shape[:2]) >= 2 * t.decode_target and s.data[:2] == b"\xff\xd8" for s in varied)
    figures = (
        f"top-1 agreement {int(agree.sum())}/{len(agree)} = {100 * agree.mean():.2f}% ({reduced} decoded reduced); "
        f"pixels vs preprocess(): per-image mean |diff| mean {d.mean():.3f}, max {d.max():.3f} "
        f"({varied[int(d.argmax())].name}); disagreeing: {_names(varied, ~agree)}"
    )
    print(figures)
    assert agree.mean() >= 0.995, figures


@pytest.mark.slow
def test_jpegs_the_cpu_path_decodes_reduced_part_only_where_the_model_hesitates(
    enlarged: list[Sample], graph_pixels: Callable[[str, Sample], np.ndarray], builtin_model: Classify
) -> None:
    """A JPEG at least twice the target is decoded reduced by the CPU path (libjpeg's scaled IDCT, not a box filter) and
    whole by the GPU: the graph then agrees with the CPU path on the whole decode, not with `preprocess`. Measured: on
    these low-confidence photographs the top-1 moves where the model's top two lie within a few percent."""
    t = TRANSFORMS["builtin"]
    gpu = builtin_model(np.concatenate([graph_pixels("builtin", s) for s in enlarged]))
    whole = builtin_model(np.stack([preprocess(s.data, t, reduced=False) for s in enlarged]))
    served = builtin_model(np.stack([preprocess(s.data, t) for s in enlarged]))
    assert (gpu.argmax(1) == whole.argmax(1)).all()
    agree = gpu.argmax(1) == served.argmax(1)
    top2 = np.sort(served, axis=1)[:, -2:]
    margins = (top2[:, 1] - top2[:, 0])[~agree]
    figures = (
        f"reduced-decoded JPEGs: top-1 agreement with preprocess() {int(agree.sum())}/{len(agree)}; the CPU path's "
        f"top-2 margins where they part: {', '.join(f'{m:.3f}' for m in margins)} "
        f"({_names(enlarged, ~agree)})"
    )
    print(figures)
    assert (margins < 0.1).all(), figures
