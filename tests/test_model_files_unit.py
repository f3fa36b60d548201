"""The files one Classifier opens (app.runtime.model_files): each fetched through the node's cache, the args pointed
at them, a failure one line naming the field, the URI and the reason, and the holds released. Local files here (the
stores' side is tests/test_storage_servers.py's); pure: no Ray, no engine."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from app.config import AppArgs
from app.runtime.model_files import ModelFileError, ModelFiles
from app.storage import ModelCache


def files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name in ("fp32", "int8", "fp16"):
        out[name] = tmp_path / f"m-{name}.bin"
        out[name].write_bytes(f"{name} bytes".encode())
    out["labels"] = tmp_path / "m-labels.txt"
    out["labels"].write_bytes(b"a\nb\n")
    return out


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def args(f: dict[str, Path], **int8: object) -> AppArgs:
    return AppArgs.model_validate(
        {
            "model": {"name": "m", "labels_path": f"file://{f['labels']}", "labels_sha256": sha(f["labels"])},
            "variants": {
                "fp32": {"model_path": str(f["fp32"])},
                "int8": {
                    "model_path": str(f["int8"]),
                    "precision": "int8",
                    "fallback": {"precision": "fp16", "model_path": str(f["fp16"])},
                    **int8,
                },
            },
            "speed_gate": {"baseline": "fp32"},
        }
    )


def test_a_variant_opens_its_file_its_fallback_the_gates_baseline_and_the_labels_each_with_its_digest(
    tmp_path: Path,
) -> None:
    f = files(tmp_path)
    local = ModelFiles(ModelCache(tmp_path / "cache")).local(args(f, sha256=sha(f["int8"])), "int8")
    assert [s.field for s in local.sources] == [
        "variants.int8.model_path",
        "variants.int8.fallback.model_path",
        "variants.fp32.model_path",
        "model.labels_path",
    ]
    assert [s.sha256 for s in local.sources] == [sha(f[k]) for k in ("int8", "fp16", "fp32", "labels")]
    assert local.model.sha256 == local.describe()["version"] == sha(f["int8"])
    a = local.args
    assert a.variants["int8"].model_path == str(f["int8"]) and a.variants["int8"].sha256 == sha(f["int8"])
    assert a.model.labels_path == str(f["labels"])  # file:// read as the path it names
    local.release()


def test_the_user_configs_version_is_what_opens(tmp_path: Path) -> None:
    f = files(tmp_path)
    v2, fb2 = tmp_path / "m-int8-v2.bin", tmp_path / "m-fp16-v2.bin"
    v2.write_bytes(b"int8 v2 bytes")
    fb2.write_bytes(b"fp16 v2 bytes")
    version = {"model_path": str(v2), "sha256": sha(v2), "fallback_model_path": f"file://{fb2}"}
    local = ModelFiles(ModelCache(tmp_path / "cache")).local(args(f), "int8", version)
    assert local.args.variants["int8"].model_path == str(v2) and local.model.sha256 == sha(v2)
    fallback = local.args.variants["int8"].fallback
    assert fallback is not None and fallback.model_path == str(fb2) and fallback.sha256 == sha(fb2)


@pytest.mark.parametrize(
    ("int8", "said"),
    [
        ({"sha256": "0" * 64}, "variants.int8.model_path: {int8}: sha256 mismatch: expected 000"),
        ({"model_path": "/nowhere/m-int8.onnx"}, "variants.int8.model_path: /nowhere/m-int8.onnx: not found"),
    ],
)
def test_a_file_that_cannot_be_had_is_one_line_naming_the_field_and_the_uri(
    tmp_path: Path, int8: dict[str, str], said: str
) -> None:
    f = files(tmp_path)
    with pytest.raises(ModelFileError) as e:
        ModelFiles(ModelCache(tmp_path / "cache")).local(args(f, **int8), "int8")
    assert str(e.value).startswith(said.format(int8=f["int8"])) and "\n" not in str(e.value)


def test_a_declared_fallback_that_cannot_be_had_fails_only_where_it_serves(tmp_path: Path) -> None:
    """configs/prod.yaml's INT8 variant declares an FP16 fallback that a node with TensorRT never opens: its file
    missing is not the variant's failure (opening it, where it would serve, says so)."""
    f = files(tmp_path)
    f["fp16"].unlink()
    local = ModelFiles(ModelCache(tmp_path / "cache")).local(args(f), "int8")
    fallback = local.args.variants["int8"].fallback
    assert fallback is not None and fallback.model_path == str(f["fp16"])  # as declared: a use of it fails
    assert "variants.int8.fallback.model_path" not in [s.field for s in local.sources]
