"""The legacy (pre-zip) PyTorch state-dict reader: the real EfficientNet-Lite0 file, and crafted files."""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

from app.toolchain.build import weights_path
from app.toolchain.weights import LEGACY_MAGIC, LEGACY_PROTOCOL, WeightsFormatError, load_legacy_state_dict

# EfficientNet-Lite0, written out independently of app.toolchain.efficientnet: (repeats, kernel, stride, expand, out).
ARCH = (
    (1, 3, 1, 1, 16),
    (2, 3, 2, 6, 24),
    (2, 5, 2, 6, 40),
    (3, 3, 2, 6, 80),
    (3, 5, 1, 6, 112),
    (4, 5, 2, 6, 192),
    (1, 3, 1, 6, 320),
)
STEM, HEAD, CLASSES = 32, 1280, 1000
BN_SUFFIXES = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _bn(prefix: str, channels: int) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"{prefix}.{s}", () if s == "num_batches_tracked" else (channels,)) for s in BN_SUFFIXES]


def expected_table() -> list[tuple[str, tuple[int, ...]]]:
    """Every entry of the lukemelas-style state dict, in file order, with its shape."""
    table = [("_conv_stem.weight", (STEM, 3, 3, 3)), *_bn("_bn0", STEM)]
    index, cin = 0, STEM
    for repeats, kernel, _stride, expand, cout in ARCH:
        for _ in range(repeats):
            p, mid = f"_blocks.{index}", cin * expand
            if expand != 1:
                table += [(f"{p}._expand_conv.weight", (mid, cin, 1, 1)), *_bn(f"{p}._bn0", mid)]
            table += [(f"{p}._depthwise_conv.weight", (mid, 1, kernel, kernel)), *_bn(f"{p}._bn1", mid)]
            table += [(f"{p}._project_conv.weight", (cout, mid, 1, 1)), *_bn(f"{p}._bn2", cout)]
            index, cin = index + 1, cout
    table += [("_conv_head.weight", (HEAD, cin, 1, 1)), *_bn("_bn1", HEAD)]
    table += [("_fc.weight", (CLASSES, HEAD)), ("_fc.bias", (CLASSES,))]
    return table


@pytest.fixture(scope="module")
def state_dict() -> collections.OrderedDict[str, np.ndarray]:
    return load_legacy_state_dict(weights_path())


# ---------------------------------------------------------------------------------------------
# The real file


def test_real_file_has_every_lite0_tensor_in_order_with_its_shape(state_dict):
    table = expected_table()
    assert len(table) == 296
    assert [(k, v.shape) for k, v in state_dict.items()] == table


def test_real_file_dtypes_and_layout(state_dict):
    counters = [k for k in state_dict if k.endswith("num_batches_tracked")]
    assert len(counters) == 49  # stem, head, block 0 (two BNs) and 15 blocks with three
    for name, value in state_dict.items():
        assert isinstance(value, np.ndarray), name  # a 0-d array, not a numpy scalar
        assert value.flags.c_contiguous, name
        if name.endswith("num_batches_tracked"):
            assert value.dtype == np.int64 and value.shape == () and int(value) >= 0, name
        else:
            assert value.dtype == np.float32, name
            assert np.isfinite(value).all(), name
    # dead channels have a running variance of exactly 0 (BN_EPS keeps the fold finite); never negative
    assert all((state_dict[k] >= 0).all() for k in state_dict if k.endswith("running_var"))


# (sum, sum of |x|, position-weighted sum (catches a wrong element order, which sums alone do not)), in float64.
CHECKSUMS = {
    "_conv_stem.weight": (-26.811376610887237, 387.1200224778149, -7.004339098800875),
    "_blocks.0._depthwise_conv.weight": (5.221442859619856, 96.54664315655828, None),
    "_blocks.15._project_conv.weight": (39.96609939538757, 19663.280239632324, None),
    "_conv_head.weight": (-21.113805372136994, 20132.00524725295, None),
    "_bn1.running_var": (13721.746045589447, 13721.746045589447, None),
    "_fc.weight": (-470.63256730128705, 65336.67289497613, -188.5757713576706),
    "_fc.bias": (-0.04981697298353538, 32.85884447465651, None),
}


@pytest.mark.parametrize("name", sorted(CHECKSUMS))
def test_real_file_checksums(state_dict, name):
    total, abs_total, weighted = CHECKSUMS[name]
    x = state_dict[name].astype(np.float64).ravel()
    assert x.sum() == pytest.approx(total, rel=1e-6, abs=1e-6)
    assert np.abs(x).sum() == pytest.approx(abs_total, rel=1e-6)
    if weighted is not None:
        assert (x * np.arange(x.size) / x.size).sum() == pytest.approx(weighted, rel=1e-6)


class _PeekUnpickler(pickle.Unpickler):
    """The test's own reading of the state-dict pickle: tensors as (storage key, offset, shape, stride)."""

    def __init__(self, f: Any) -> None:
        super().__init__(f)
        self.storage_dtypes: dict[str, np.dtype] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, shape, stride, *_: (storage, offset, tuple(shape), tuple(stride))
        if (module, name) == ("torch", "FloatStorage"):
            return np.dtype("<f4")
        if (module, name) == ("torch", "LongStorage"):
            return np.dtype("<i8")
        raise AssertionError(f"unexpected global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        self.storage_dtypes[pid[2]] = pid[1]
        return pid[2]


def _raw_file(path: Path) -> tuple[dict[str, tuple], dict[str, np.ndarray]]:
    """(name -> (storage key, offset, shape, stride), storage key -> flat storage) of the trusted packaged file."""
    with open(path, "rb") as f:
        for _ in range(3):
            pickle.load(f)  # magic, protocol, sys info
        peek = _PeekUnpickler(f)
        refs = peek.load()
        storages = {}
        for key in pickle.load(f):
            (count,) = struct.unpack("<q", f.read(8))
            dtype = peek.storage_dtypes[key]
            storages[key] = np.frombuffer(f.read(count * dtype.itemsize), dtype)
    return refs, storages


def test_real_file_non_contiguous_strides_match_as_strided(state_dict):
    """50 tensors are stored in TF's layout (e.g. the stem as HWIO); the reader must honour the strides."""
    refs, storages = _raw_file(weights_path())
    assert refs["_conv_stem.weight"][3] == (1, 32, 288, 96)
    non_contiguous = 0
    for name, (key, offset, shape, stride) in refs.items():
        storage = storages[key]
        if not shape:
            expected = storage[offset]
        else:
            expected = np.lib.stride_tricks.as_strided(
                storage[offset:], shape=shape, strides=[s * storage.itemsize for s in stride], writeable=False
            )
            non_contiguous += not expected.flags.c_contiguous
        np.testing.assert_array_equal(state_dict[name], expected, err_msg=name)
    assert non_contiguous == 50
    # Independently of as_strided: stride (1, 32, 288, 96) is an HWIO (3, 3, 3, 32) storage, transposed to OIHW.
    stem = storages[refs["_conv_stem.weight"][0]]
    np.testing.assert_array_equal(state_dict["_conv_stem.weight"], stem.reshape(3, 3, 3, 32).transpose(3, 2, 0, 1))


# ---------------------------------------------------------------------------------------------
# Crafted files. The pickles name torch's globals; torch is not installed, so stand-ins are
# registered in sys.modules only while pickling (pickle checks that a global can be imported).

_TORCH = types.ModuleType("torch")
_TORCH_UTILS = types.ModuleType("torch._utils")


def _rebuild_tensor_v2(*args: Any) -> Any:  # only ever named in a pickle, never called
    raise AssertionError("the reader must not call torch's rebuild function")


_rebuild_tensor_v2.__module__ = "torch._utils"
_TORCH_UTILS._rebuild_tensor_v2 = _rebuild_tensor_v2  # type: ignore[attr-defined]
_TORCH._utils = _TORCH_UTILS  # type: ignore[attr-defined]
for _name in ("FloatStorage", "LongStorage", "CudaFloatStorage"):
    setattr(_TORCH, _name, type(_name, (), {"__module__": "torch"}))
_STORAGE_OF = {np.dtype("<f4"): "FloatStorage", np.dtype("<i8"): "LongStorage"}
SYS_INFO = {"protocol_version": LEGACY_PROTOCOL, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}


@dataclass(frozen=True)
class Storage:
    key: str
    data: np.ndarray
    kind: str | None = None  # storage class name; default from the dtype


@dataclass(frozen=True)
class Tensor:
    storage: Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def __reduce__(self) -> Any:
        return (
            _rebuild_tensor_v2,
            (self.storage, self.offset, self.shape, self.stride, False, collections.OrderedDict()),
        )


class Evil:
    """Unpickling this runs `touch <marker>`: a reader that executes it has a code-execution hole."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Storage):
            kind = obj.kind or _STORAGE_OF[obj.data.dtype]
            return ("storage", getattr(_TORCH, kind), obj.key, "cpu", obj.data.size, None)
        return None


def legacy_bytes(
    state: Any,
    storages: list[Storage],
    *,
    magic: Any = LEGACY_MAGIC,
    protocol: Any = LEGACY_PROTOCOL,
    sys_info: Any = None,
    keys: Any = None,
) -> bytes:
    """A file laid out the way torch.save(..., _use_new_zipfile_serialization=False) writes one."""
    buf = io.BytesIO()
    with mock.patch.dict(sys.modules, {"torch": _TORCH, "torch._utils": _TORCH_UTILS}):
        pickle.dump(magic, buf, protocol=2)
        pickle.dump(protocol, buf, protocol=2)
        pickle.dump(SYS_INFO if sys_info is None else sys_info, buf, protocol=2)
        _Pickler(buf, protocol=2).dump(state)
        pickle.dump([s.key for s in storages] if keys is None else keys, buf, protocol=2)
    for s in storages:
        buf.write(struct.pack("<q", s.data.size))
        buf.write(s.data.astype(s.data.dtype.newbyteorder("<")).tobytes())
    return buf.getvalue()


def small_state() -> tuple[collections.OrderedDict, list[Storage]]:
    floats = Storage("0", np.arange(30, dtype=np.float32))
    counter = Storage("1", np.array([7, 123456789012], dtype=np.int64))
    state = collections.OrderedDict(
        contiguous=Tensor(floats, 0, (2, 3), (3, 1)),
        transposed=Tensor(floats, 2, (3, 4), (1, 3)),  # column-major view starting at element 2
        stepped=Tensor(floats, 1, (2, 2, 2), (12, 1, 5)),
        tail=Tensor(floats, 26, (4,), (1,)),
        broadcast=Tensor(floats, 5, (2, 3), (0, 1)),
        scalar=Tensor(counter, 1, (), ()),
    )
    return state, [floats, counter]


def _write(tmp_path: Path, data: bytes, name: str = "w.pth") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_crafted_file_round_trips_offsets_strides_and_scalars(tmp_path):
    state, storages = small_state()
    sd = load_legacy_state_dict(_write(tmp_path, legacy_bytes(state, storages)))
    base = np.arange(30, dtype=np.float32)
    assert list(sd) == list(state)
    np.testing.assert_array_equal(sd["contiguous"], base[:6].reshape(2, 3))
    np.testing.assert_array_equal(sd["transposed"], base[2:14].reshape(4, 3).T)
    np.testing.assert_array_equal(sd["stepped"], [[[1, 6], [2, 7]], [[13, 18], [14, 19]]])
    np.testing.assert_array_equal(sd["tail"], [26, 27, 28, 29])
    np.testing.assert_array_equal(sd["broadcast"], [[5, 6, 7], [5, 6, 7]])
    assert sd["scalar"].shape == () and sd["scalar"].dtype == np.int64 and int(sd["scalar"]) == 123456789012
    for name, value in sd.items():
        assert isinstance(value, np.ndarray) and value.flags.c_contiguous, name
        assert value.dtype == (np.int64 if name == "scalar" else np.float32), name


@pytest.mark.parametrize("where", ["magic", "protocol", "sys_info", "state", "tensor", "keys"])
def test_refuses_a_pickle_naming_another_global_without_running_it(tmp_path, where):
    marker = tmp_path / "pwned"
    state, storages = small_state()
    evil = Evil(marker)
    kwargs: dict[str, Any] = {}
    if where == "state":
        state = collections.OrderedDict(weight=state["contiguous"], payload=evil)
    elif where == "tensor":
        state["contiguous"] = Tensor(storages[0], 0, evil, (1,))  # type: ignore[arg-type]
    elif where != "state":
        kwargs[where] = evil
    path = _write(tmp_path, legacy_bytes(state, storages, **kwargs))
    with pytest.raises(WeightsFormatError, match=r"system"):
        load_legacy_state_dict(path)
    assert not marker.exists(), f"the reader executed a pickled os.system call hidden in the {where}"


def test_refuses_a_storage_class_it_does_not_know(tmp_path):
    state, storages = small_state()
    gpu = Storage("0", storages[0].data, kind="CudaFloatStorage")
    state["contiguous"] = Tensor(gpu, 0, (2, 3), (3, 1))
    with pytest.raises(WeightsFormatError, match="CudaFloatStorage"):
        load_legacy_state_dict(_write(tmp_path, legacy_bytes(state, storages)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"magic": 0x1950A86A20F9469CFC6D}, "bad magic number"),
        ({"magic": "PK"}, "bad magic number"),
        ({"protocol": 1000}, "protocol version"),
    ],
)
def test_refuses_a_bad_header(tmp_path, kwargs, message):
    state, storages = small_state()
    with pytest.raises(WeightsFormatError, match=message):
        load_legacy_state_dict(_write(tmp_path, legacy_bytes(state, storages, **kwargs)))


@pytest.mark.parametrize(
    "data",
    [b"", b"PK\x03\x04" + bytes(60), b"\x80\x02garbage that is not a pickle", bytes(range(256)) * 4],
    ids=["empty", "zip", "broken-pickle", "noise"],
)
def test_refuses_files_that_are_not_legacy_pickles(tmp_path, data):
    with pytest.raises(WeightsFormatError):
        load_legacy_state_dict(_write(tmp_path, data))


def test_every_truncation_of_a_crafted_file_is_a_format_error(tmp_path):
    state, storages = small_state()
    data = legacy_bytes(state, storages)
    load_legacy_state_dict(_write(tmp_path, data))  # the whole file is fine
    for n in range(len(data)):
        with pytest.raises(WeightsFormatError):
            load_legacy_state_dict(_write(tmp_path, data[:n]))


@pytest.mark.parametrize("cut", [10, 30_000, 47_176, 47_180, 9_000_000, -1])
def test_truncated_real_file_is_a_format_error(tmp_path, cut):
    """Cuts in the header, the state-dict pickle, at the first storage, inside it, in the middle, at the end."""
    data = weights_path().read_bytes()
    with pytest.raises(WeightsFormatError):
        load_legacy_state_dict(_write(tmp_path, data[:cut]))


@pytest.mark.parametrize(
    ("offset", "shape", "stride"),
    [(0, (4, 8), (8, 1)), (25, (2, 3), (3, 1)), (0, (3,), (15,)), (30, (1,), (1,)), (-1, (2,), (1,)), (4, (2,), (-2,))],
)
def test_refuses_a_tensor_that_reaches_outside_its_storage(tmp_path, offset, shape, stride):
    """Without this check as_strided would read whatever memory follows the storage."""
    floats = Storage("0", np.arange(30, dtype=np.float32))
    state = collections.OrderedDict(w=Tensor(floats, offset, shape, stride))
    with pytest.raises(WeightsFormatError, match="storage"):
        load_legacy_state_dict(_write(tmp_path, legacy_bytes(state, [floats])))


def test_refuses_a_scalar_outside_its_storage(tmp_path):
    longs = Storage("0", np.array([1, 2], dtype=np.int64))
    state = collections.OrderedDict(n=Tensor(longs, 2, (), ()))
    with pytest.raises(WeightsFormatError, match="outside"):
        load_legacy_state_dict(_write(tmp_path, legacy_bytes(state, [longs])))


def test_refuses_a_file_whose_storage_list_leaves_one_out(tmp_path):
    state, storages = small_state()
    data = legacy_bytes(state, storages[:1], keys=["0"])
    with pytest.raises(WeightsFormatError, match="missing"):
        load_legacy_state_dict(_write(tmp_path, data))


@pytest.mark.parametrize("what", ["state", "keys"])
def test_refuses_wrongly_typed_pickles(tmp_path, what):
    state, storages = small_state()
    data = legacy_bytes([1, 2, 3], storages) if what == "state" else legacy_bytes(state, storages, keys="01")
    with pytest.raises(WeightsFormatError):
        load_legacy_state_dict(_write(tmp_path, data))
