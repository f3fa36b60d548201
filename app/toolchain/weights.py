"""Read a PyTorch state dict saved in the legacy (pre-zip) serialization format.

torch is deliberately not a dependency: the format is five pickles followed by
raw storages, so numpy and the standard library are enough.

Layout of a legacy file:
    pickle(magic number) pickle(protocol version) pickle(sys info)
    pickle(the object; tensors refer to storages by persistent id)
    pickle(list of storage keys, in the order their data follows)
    for each key: int64 element count, then count * itemsize raw little-endian bytes
"""

from __future__ import annotations

import collections
import pickle
import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001

STORAGE_DTYPES: dict[str, np.dtype] = {
    "FloatStorage": np.dtype("<f4"),
    "DoubleStorage": np.dtype("<f8"),
    "HalfStorage": np.dtype("<f2"),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
}


class WeightsFormatError(ValueError):
    """The file is not a legacy PyTorch state dict this reader understands."""


class _TensorRef:
    """A tensor as the pickle describes it, before its storage is read."""

    def __init__(self, storage: tuple, offset: int, shape: tuple, stride: tuple) -> None:
        self.storage_key: str = storage[2]
        self.dtype = STORAGE_DTYPES[storage[1]]
        self.offset = offset
        self.shape = tuple(shape)
        self.stride = tuple(stride)


def _rebuild_tensor_v2(storage: tuple, offset: int, shape: tuple, stride: tuple, *_: Any) -> _TensorRef:
    return _TensorRef(storage, offset, shape, stride)


class _StateDictUnpickler(pickle.Unpickler):
    """Resolves only the handful of globals a state dict needs; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor_v2
        if module == "torch" and name in STORAGE_DTYPES:
            return name
        raise WeightsFormatError(f"refusing to load global {module}.{name} from a weights file")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise WeightsFormatError(f"unexpected persistent id {pid!r}")
        if pid[1] not in STORAGE_DTYPES:
            raise WeightsFormatError(f"unsupported storage type {pid[1]!r}")
        return pid


class _PlainUnpickler(pickle.Unpickler):
    """For the header pickles and the storage key list: plain values only, no globals at all."""

    def find_class(self, module: str, name: str) -> Any:
        raise WeightsFormatError(f"refusing to load global {module}.{name} from a weights file")

    def persistent_load(self, pid: Any) -> Any:
        raise WeightsFormatError(f"unexpected persistent id {pid!r}")


def _unpickle(f: BinaryIO, unpickler: type[pickle.Unpickler], path: str | Path, what: str) -> Any:
    """One pickle from `f` through a restricted unpickler; any failure is a WeightsFormatError."""
    try:
        return unpickler(f).load()
    except WeightsFormatError as e:
        raise WeightsFormatError(f"{path}: {e}") from e
    except Exception as e:  # any unpickling failure means "not this format"
        raise WeightsFormatError(f"{path}: not a legacy PyTorch file ({what}: {e})") from e


def _read_storage(f: BinaryIO, dtype: np.dtype) -> np.ndarray:
    header = f.read(8)
    if len(header) != 8:
        raise WeightsFormatError("file ends inside a storage header")
    (count,) = struct.unpack("<q", header)
    raw = f.read(count * dtype.itemsize)
    if len(raw) != count * dtype.itemsize:
        raise WeightsFormatError("file ends inside storage data")
    return np.frombuffer(raw, dtype=dtype)


def _check_fits(ref: _TensorRef, size: int) -> None:
    """A crafted or corrupt file must not make as_strided read outside the storage."""
    ok = len(ref.stride) == len(ref.shape) and ref.offset >= 0 and all(s >= 0 for s in ref.stride)
    if ok and all(ref.shape):
        ok = ref.offset + sum((n - 1) * s for n, s in zip(ref.shape, ref.stride, strict=True)) < size
    if not ok:
        raise WeightsFormatError(
            f"tensor of shape {ref.shape}, stride {ref.stride}, offset {ref.offset} does not fit its storage of {size}"
        )


def _materialise(ref: _TensorRef, storage: np.ndarray) -> np.ndarray:
    if not ref.shape:
        if not 0 <= ref.offset < storage.size:
            raise WeightsFormatError(f"scalar tensor at offset {ref.offset} is outside its storage of {storage.size}")
        return np.array(storage[ref.offset])  # a 0-d array, like every other value: not a numpy scalar
    _check_fits(ref, storage.size)
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[ref.offset :],
        shape=ref.shape,
        strides=tuple(s * item for s in ref.stride),
        writeable=False,
    )
    return np.ascontiguousarray(view)


def load_legacy_state_dict(path: str | Path) -> collections.OrderedDict[str, np.ndarray]:
    """Return the state dict in `path` as name -> contiguous numpy array."""
    with open(path, "rb") as f:
        # Every pickle goes through a restricted unpickler: plain pickle.load would run any global it names.
        magic = _unpickle(f, _PlainUnpickler, path, "magic number")
        if magic != LEGACY_MAGIC:
            raise WeightsFormatError(f"{path}: bad magic number {magic!r}")
        protocol = _unpickle(f, _PlainUnpickler, path, "protocol version")
        if protocol != LEGACY_PROTOCOL:
            raise WeightsFormatError(f"{path}: unsupported protocol version {protocol!r}")
        _unpickle(f, _PlainUnpickler, path, "sys info")  # endianness and C type sizes, not needed for storages
        state = _unpickle(f, _StateDictUnpickler, path, "state dict")
        if not isinstance(state, dict):
            raise WeightsFormatError(f"{path}: holds a {type(state).__name__}, not a state dict")
        keys = _unpickle(f, _PlainUnpickler, path, "storage keys")
        if not isinstance(keys, list):
            raise WeightsFormatError(f"{path}: storage key list is a {type(keys).__name__}")
        refs = {k: v for k, v in state.items() if isinstance(v, _TensorRef)}
        dtype_of = {r.storage_key: r.dtype for r in refs.values()}
        storages = {key: _read_storage(f, dtype_of.get(key, np.dtype("u1"))) for key in keys}
    missing = {r.storage_key for r in refs.values()} - storages.keys()
    if missing:
        raise WeightsFormatError(f"{path}: storages missing from file: {sorted(missing)[:3]}")
    return collections.OrderedDict((name, _materialise(r, storages[r.storage_key])) for name, r in refs.items())
