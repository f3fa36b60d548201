"""`python -m app.models publish`: a config's model files into a store as one immutable version, against real stores
(a directory, and moto's S3 server reached only through the standard AWS_* variables; no client is mocked).

What is checked: the objects and the manifest hold the files' bytes and digests; the printed config parses as YAML,
validates as the app's args and each Classifier's user_config, and pins the right digests; publishing the same bytes
again writes nothing (the report says so, and the store shows no new write); changed bytes go to a new version and
leave the old one as it was; a named version is never overwritten; an interrupted publish is finished; and a missing
file, a remote one, a missing bucket or refused credentials each exit 1 with one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY
from urllib.parse import quote

import pytest
import yaml

from app.config import AppArgs
from app.config.classifier import ClassifierConfig
from app.models.cli import main
from tests.storage_servers import S3Server

REPO = Path(__file__).resolve().parent.parent


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Model:
    """Small stand-ins for a model's files (publish treats them as bytes) and a Serve config naming them."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "models"
        self.dir.mkdir(parents=True)
        self.files = {
            "m-fp32.onnx": b"fp32 weights " * 1000,
            "m-int8.onnx": b"int8 weights " * 300,
            "m-fp16.onnx": b"fp16 weights " * 500,
            "m-labels.txt": b"cat\ndog\nbird\n",
            "m-int8.report.json": b'{"quality": {"top1_agreement": 0.99}}\n',
            "m-int8.report.md": b"# m-int8\n\ntop-1 agreement 0.99\n",
            "m-fp16.report.json": b'{"quality": {"top1_agreement": 1.0}}\n',
        }
        for name, data in self.files.items():
            (self.dir / name).write_bytes(data)
        self.config = root / "serve.yaml"
        # Three ways to name a local file: a path, a file:// URI, and a path relative to the working directory.
        args = {
            "model": {"name": "m", "labels_path": str(self.dir / "m-labels.txt")},
            "variants": {
                "fp32": {"model_path": str(self.dir / "m-fp32.onnx"), "description": "reference"},
                "int8": {
                    "model_path": f"file://{self.dir / 'm-int8.onnx'}",
                    "precision": "int8",
                    "fallback": {"precision": "fp16", "model_path": os.path.relpath(self.dir / "m-fp16.onnx")},
                },
            },
            "build_default_models": False,
        }
        self.cfg = {
            "applications": [
                {
                    "name": "classifier",
                    "import_path": "app.main:build_app",
                    "args": args,
                    "deployments": [{"name": "Classifier_int8", "user_config": {"max_batch_size": 8}}],
                }
            ]
        }
        self.write_config()

    def write_config(self) -> None:
        self.config.write_text(yaml.safe_dump(self.cfg, sort_keys=False))

    @property
    def args(self) -> dict[str, Any]:
        return self.cfg["applications"][0]["args"]

    def change(self, name: str, data: bytes) -> None:
        self.files[name] = data
        (self.dir / name).write_bytes(data)

    def roles(self) -> dict[str, str]:
        return {
            "m-fp32.onnx": "variant:fp32",
            "m-int8.onnx": "variant:int8",
            "m-fp16.onnx": "fallback:int8",
            "m-labels.txt": "labels",
            "m-int8.report.json": "report:m-int8.onnx",
            "m-int8.report.md": "report:m-int8.onnx",
            "m-fp16.report.json": "report:m-fp16.onnx",
        }


@pytest.fixture
def model(tmp_path: Path) -> Model:
    return Model(tmp_path / "src")


def publish(capsys: pytest.CaptureFixture[str], model: Model, to: str, *extra: str) -> tuple[int, str, str]:
    """The command in-process: its exit status, stdout and stderr."""
    rc = main(["publish", "--config", str(model.config), "--to", to, *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def publish_json(capsys: pytest.CaptureFixture[str], model: Model, to: str, *extra: str) -> dict[str, Any]:
    rc, out, err = publish(capsys, model, to, "--json", *extra)
    assert rc == 0, err
    return json.loads(out)


def expected_version(model: Model) -> str:
    """The content version, computed here from the files as the manifest lists them (not by publish's code)."""
    files = {
        name: {"sha256": sha256(data), "bytes": len(data), "role": model.roles()[name]}
        for name, data in sorted(model.files.items())
    }
    content = {"model": "m", "files": files, "published_by": "app.models publish"}
    return "sha256-" + sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode())[:12]


def check_blocks(model: Model, args_block: dict[str, Any], release: dict[str, Any], prefix: str) -> None:
    """The printed config: URIs under the version's prefix, the files' digests, and it validates as the app's args
    (merged into the config's) and as each Classifier's user_config."""
    files = model.files
    assert args_block["model"] == {
        "labels_path": prefix + "m-labels.txt",
        "labels_sha256": sha256(files["m-labels.txt"]),
    }
    assert args_block["variants"] == {
        "fp32": {"model_path": prefix + "m-fp32.onnx", "sha256": sha256(files["m-fp32.onnx"])},
        "int8": {
            "model_path": prefix + "m-int8.onnx",
            "sha256": sha256(files["m-int8.onnx"]),
            "fallback": {"model_path": prefix + "m-fp16.onnx", "sha256": sha256(files["m-fp16.onnx"])},
        },
    }
    merged = json.loads(json.dumps(model.args))
    merged["model"].update(args_block["model"])
    for name, keys in args_block["variants"].items():
        fallback = keys.pop("fallback", None)
        merged["variants"][name].update(keys)
        if fallback:
            merged["variants"][name]["fallback"].update(fallback)
    served = AppArgs.model_validate(merged)
    assert served.variants["int8"].fallback is not None
    assert served.variants["int8"].fallback.sha256 == sha256(files["m-fp16.onnx"])
    assert served.model.labels_sha256 == sha256(files["m-labels.txt"])
    fallback = {"fallback_model_path": prefix + "m-fp16.onnx", "fallback_sha256": sha256(files["m-fp16.onnx"])}
    assert release == {
        "deployments": [
            {
                "name": f"Classifier_{v}",
                "user_config": {"model_path": prefix + f"m-{v}.onnx", "sha256": sha256(files[f"m-{v}.onnx"])}
                | (fallback if v == "int8" else {}),  # the INT8 variant's declared fallback, of the same version
            }
            for v in ("fp32", "int8")
        ]
    }
    for d in release["deployments"]:
        ClassifierConfig.model_validate(d["user_config"])


def check_manifest(model: Model, manifest: bytes, version: str) -> None:
    assert json.loads(manifest) == {
        "model": "m",
        "version": version,
        "files": {
            name: {"sha256": sha256(data), "bytes": len(data), "role": model.roles()[name]}
            for name, data in sorted(model.files.items())
        },
        "published_by": "app.models publish",
    }
    assert list(json.loads(manifest)) == ["model", "version", "files", "published_by"]


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------------------------------------
# A directory


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under `root`: inode, modification time and bytes (a rewrite through a temporary file and a move
    changes the inode)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_ino, st.st_mtime_ns, p.read_bytes())
    return out


def test_publish_to_a_directory_then_again(capsys: pytest.CaptureFixture[str], model: Model, tmp_path: Path) -> None:
    store = tmp_path / "a store"  # a space: file:// URIs are percent-quoted, and read back to the same path
    got = publish_json(capsys, model, str(store))
    version = expected_version(model)
    prefix = f"file://{quote(str(store))}/m/{version}/"
    assert (got["version"], got["prefix"], got["model"]) == (version, prefix, "m")
    assert got["uploaded"] == [*sorted(model.files), "manifest.json"] and got["skipped"] == []
    where = store / "m" / version
    assert sorted(p.name for p in where.iterdir()) == sorted([*model.files, "manifest.json"])  # no temporary left
    for name, data in model.files.items():
        assert (where / name).read_bytes() == data
    check_manifest(model, (where / "manifest.json").read_bytes(), version)
    check_blocks(model, got["args"], got["release"], prefix)
    served = AppArgs.model_validate({**model.args, "variants": got["args"]["variants"]})
    assert served.resolved_path(served.variants["fp32"].model_path) == where / "m-fp32.onnx"

    before = snapshot(store)
    rc, out, err = publish(capsys, model, prefix.split("/m/")[0])  # the same store as a file:// URI; the YAML form
    assert rc == 0, err
    assert snapshot(store) == before
    assert "# 0 uploaded, 8 already there" in out
    args_block, release = yaml.safe_load_all(out)
    check_blocks(model, args_block, release, prefix)


def test_changed_bytes_are_a_new_version_beside_the_old(
    capsys: pytest.CaptureFixture[str], model: Model, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    first = publish_json(capsys, model, str(store))
    before = snapshot(store)
    model.change("m-int8.onnx", b"requantized " * 300)
    second = publish_json(capsys, model, str(store))
    assert second["version"] == expected_version(model) != first["version"]
    assert second["uploaded"] == [*sorted(model.files), "manifest.json"]
    after = snapshot(store)
    assert {k: v for k, v in after.items() if k in before} == before  # the old version untouched
    check_manifest(model, (store / "m" / second["version"] / "manifest.json").read_bytes(), second["version"])
    check_blocks(model, second["args"], second["release"], second["prefix"])


def test_a_named_version_is_never_overwritten(capsys: pytest.CaptureFixture[str], model: Model, tmp_path: Path) -> None:
    store = tmp_path / "store"
    got = publish_json(capsys, model, str(store), "--version", "v1")
    assert got["prefix"] == f"file://{store}/m/v1/"
    check_manifest(model, (store / "m" / "v1" / "manifest.json").read_bytes(), "v1")
    before = snapshot(store)
    assert publish_json(capsys, model, str(store), "--version", "v1")["uploaded"] == []  # same bytes: fine
    model.change("m-labels.txt", b"cat\ndog\nfish\n")
    rc, out, err = publish(capsys, model, str(store), "--version", "v1")
    assert rc == 1 and out == ""
    assert one_line(err) == (
        f"error: file://{store}/m/v1 holds another version: a published version is never overwritten; publish under "
        "a new --version"
    )
    assert snapshot(store) == before


def test_an_interrupted_publish_is_finished(capsys: pytest.CaptureFixture[str], model: Model, tmp_path: Path) -> None:
    """No manifest: the prefix is not a published version; what is there with the right bytes stays, the rest (a
    missing file, one of the right size but other bytes) is written, then the manifest."""
    store = tmp_path / "store"
    version = publish_json(capsys, model, str(store))["version"]
    where = store / "m" / version
    (where / "manifest.json").unlink()
    (where / "m-fp32.onnx").unlink()
    (where / "m-int8.onnx").write_bytes(b"x" * len(model.files["m-int8.onnx"]))
    got = publish_json(capsys, model, str(store))
    assert got["uploaded"] == ["m-fp32.onnx", "m-int8.onnx", "manifest.json"]
    assert got["skipped"] == sorted(set(model.files) - {"m-fp32.onnx", "m-int8.onnx"})
    for name, data in model.files.items():
        assert (where / name).read_bytes() == data
    check_manifest(model, (where / "manifest.json").read_bytes(), version)


def test_a_missing_local_file_names_its_field(capsys: pytest.CaptureFixture[str], model: Model, tmp_path: Path) -> None:
    store = tmp_path / "store"
    (model.dir / "m-fp16.onnx").unlink()
    missing = Path(model.args["variants"]["int8"]["fallback"]["model_path"]).absolute()  # as the config resolves it
    rc, out, err = publish(capsys, model, str(store))
    assert rc == 1 and out == ""
    assert one_line(err) == f"error: variants.int8.fallback.model_path: not found: {missing}"
    assert not store.exists()


def test_a_remote_file_is_already_published(capsys: pytest.CaptureFixture[str], model: Model, tmp_path: Path) -> None:
    model.args["variants"]["fp32"]["model_path"] = "s3://elsewhere/m/v0/m-fp32.onnx"
    model.write_config()
    rc, _, err = publish(capsys, model, str(tmp_path / "store"))
    assert rc == 1
    assert one_line(err).startswith("error: variants.fp32.model_path: already published: s3://elsewhere/m/v0/")


def test_a_file_two_fields_name_is_published_once_with_both_roles(
    capsys: pytest.CaptureFixture[str], model: Model, tmp_path: Path
) -> None:
    model.args["variants"]["int8"]["fallback"] = {"precision": "fp32", "model_path": str(model.dir / "m-fp32.onnx")}
    model.write_config()
    del model.files["m-fp16.onnx"], model.files["m-fp16.report.json"]
    got = publish_json(capsys, model, str(tmp_path / "store"))
    manifest = json.loads((tmp_path / "store" / "m" / got["version"] / "manifest.json").read_bytes())
    assert manifest["files"]["m-fp32.onnx"]["role"] == "variant:fp32,fallback:int8"
    assert sorted(manifest["files"]) == sorted(model.files)
    assert got["args"]["variants"]["int8"]["fallback"]["model_path"] == got["prefix"] + "m-fp32.onnx"


def test_config_mistakes_are_one_line(capsys: pytest.CaptureFixture[str], model: Model, tmp_path: Path) -> None:
    del model.args["model"]  # own files without a declaration: AppArgs refuses it
    model.write_config()
    rc, _, err = publish(capsys, model, str(tmp_path / "store"))
    assert rc == 1
    assert one_line(err).startswith(f"error: {model.config}: applications[0].args: Value error, model: required")
    rc, _, err = publish(capsys, model, str(tmp_path / "store"), "--app", "3")
    assert rc == 1 and one_line(err) == f"error: {model.config}: --app 3: there are 1 applications"
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(
    ("to", "says"),
    [
        ("https://example.com/models", "https:// is read-only"),
        ("file://otherhost{tmp}/models", "a file:// URI names this node's files"),
        ("ftp://example.com/models", "publish to s3://, gs://, file:// or a directory"),
    ],
)
def test_stores_that_cannot_be_published_to(
    capsys: pytest.CaptureFixture[str], model: Model, tmp_path: Path, to: str, says: str
) -> None:
    to = to.format(tmp=tmp_path)  # were the host ignored, the files would land under tmp_path, not in /
    rc, out, err = publish(capsys, model, to)
    assert rc == 1 and out == ""
    line = one_line(err)
    assert line.startswith(f"error: --to {to}: ") and says in line


def test_bad_version_names_are_refused(capsys: pytest.CaptureFixture[str], model: Model, tmp_path: Path) -> None:
    for name in ("a/b", "..", "v 1"):
        with pytest.raises(SystemExit) as exit_:
            main(["publish", "--config", str(model.config), "--to", str(tmp_path), "--version", name])
        assert exit_.value.code == 2
        assert "letters, digits" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# S3 (moto's server, through the standard AWS_* variables only)


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server, with this process's AWS_* variables pointing at it (and at nothing else) for the test."""
    for name in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


def bucket(s3: S3Server, name: str) -> str:
    s3.client().create_bucket(Bucket=name)
    return name


def objects(s3: S3Server, name: str) -> dict[str, bytes]:
    """Every object in the bucket, by key."""
    client = s3.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=name).get("Contents", [])]
    return {k: client.get_object(Bucket=name, Key=k)["Body"].read() for k in keys}


def writes(s3: S3Server, name: str) -> int:
    """Requests that can write an object in the bucket (a PUT, or a multipart upload's POSTs and PUTs) the server has
    answered so far."""
    with s3.app.lock:
        return sum(
            n
            for (method, path), n in s3.app.requests.items()
            if method in ("PUT", "POST") and path.startswith(f"/{name}/")
        )


def test_publish_to_s3_then_again(capsys: pytest.CaptureFixture[str], model: Model, s3: S3Server) -> None:
    b = bucket(s3, "pub-again")
    got = publish_json(capsys, model, f"s3://{b}/team/models/")
    version = expected_version(model)
    prefix = f"s3://{b}/team/models/m/{version}/"
    assert (got["version"], got["prefix"]) == (version, prefix)
    assert got["uploaded"] == [*sorted(model.files), "manifest.json"] and got["skipped"] == []
    stored = objects(s3, b)
    key = f"team/models/m/{version}/"
    assert stored == {key + name: data for name, data in model.files.items()} | {key + "manifest.json": ANY}
    check_manifest(model, stored[key + "manifest.json"], version)
    check_blocks(model, got["args"], got["release"], prefix)

    client = s3.client()
    heads = {k: client.head_object(Bucket=b, Key=k)["ETag"] for k in stored}
    written = writes(s3, b)
    assert written >= len(stored)
    rc, out, err = publish(capsys, model, f"s3://{b}/team/models")
    assert rc == 0, err
    assert "# 0 uploaded, 8 already there" in out
    assert writes(s3, b) == written  # not one write request
    assert objects(s3, b) == stored
    assert {k: client.head_object(Bucket=b, Key=k)["ETag"] for k in stored} == heads
    args_block, release = yaml.safe_load_all(out)
    check_blocks(model, args_block, release, prefix)


def test_s3_new_bytes_new_version_and_a_named_version_kept(
    capsys: pytest.CaptureFixture[str], model: Model, s3: S3Server
) -> None:
    b = bucket(s3, "pub-versions")
    first = publish_json(capsys, model, f"s3://{b}")
    before = objects(s3, b)
    model.change("m-fp16.onnx", b"fp16 weights, rebuilt " * 400)
    second = publish_json(capsys, model, f"s3://{b}")
    assert second["version"] == expected_version(model) != first["version"]
    after = objects(s3, b)
    assert {k: v for k, v in after.items() if k in before} == before
    assert after[f"m/{second['version']}/m-fp16.onnx"] == model.files["m-fp16.onnx"]
    check_blocks(model, second["args"], second["release"], f"s3://{b}/m/{second['version']}/")

    publish_json(capsys, model, f"s3://{b}", "--version", "v1")
    kept, written = objects(s3, b), writes(s3, b)
    model.change("m-int8.onnx", b"int8 weights, recalibrated " * 100)
    rc, out, err = publish(capsys, model, f"s3://{b}", "--version", "v1")
    assert rc == 1 and out == ""
    assert one_line(err) == (
        f"error: s3://{b}/m/v1 holds another version: a published version is never overwritten; publish under a new "
        "--version"
    )
    assert writes(s3, b) == written and objects(s3, b) == kept


def test_s3_a_bucket_that_does_not_exist(capsys: pytest.CaptureFixture[str], model: Model, s3: S3Server) -> None:
    rc, out, err = publish(capsys, model, "s3://no-such-bucket/models")
    assert rc == 1 and out == ""
    line = one_line(err)
    assert line.startswith("error: s3://no-such-bucket/models/m/sha256-") and "bucket does not exist" in line


def test_s3_credentials_without_permission(
    capsys: pytest.CaptureFixture[str], model: Model, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = bucket(s3, "pub-denied")
    key_id, secret = s3.user_without_policy("publisher-without-policy")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    with s3.enforcing_auth():
        rc, out, err = publish(capsys, model, f"s3://{b}/models")
    assert rc == 1 and out == ""
    line = one_line(err)
    assert line.startswith(f"error: s3://{b}/models/m/sha256-") and "ACCESS_DENIED" in line
    assert objects(s3, b) == {}


def test_the_command_end_to_end(model: Model, s3: S3Server) -> None:
    """`python -m app.models publish` in a process of its own, with only the standard variables to find the store."""
    b = bucket(s3, "pub-e2e")
    done = subprocess.run(
        [sys.executable, "-m", "app.models", "publish", "--config", str(model.config), "--to", f"s3://{b}/models"],
        cwd=os.getcwd(),  # the config's relative path is relative to it, as for `serve run`
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    version = expected_version(model)
    assert done.stdout.startswith(f"# m {version} -> s3://{b}/models/m/{version}/\n")
    args_block, release = yaml.safe_load_all(done.stdout)
    check_blocks(model, args_block, release, f"s3://{b}/models/m/{version}/")
    stored = objects(s3, b)
    for name, data in model.files.items():
        assert stored[f"models/m/{version}/{name}"] == data
    check_manifest(model, stored[f"models/m/{version}/manifest.json"], version)
