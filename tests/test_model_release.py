"""A model version released in place on the running app (configs/local.yaml on the session's Ray cluster): a
Classifier's user_config names another file and its sha256, Serve reconfigures the running replica (no restart),
which prepares the new version beside the serving one and switches between two batches. Under concurrent requests:
none fails, and /v1/models names the new version; a wrong digest leaves the old version serving and says why; going
back to the first version fetches nothing (the node's cache has it).

The new version is the INT8 build with another producer version in its metadata: other bytes, the same graph (what a
re-quantization that changed nothing visible would publish). The files are local (a path and its sha256): the
store's side of a fetch (S3, HTTPS, the lock, the cache) is tests/test_storage_servers.py's, through the same
`app.storage` the replica calls. Which versions may replace which (the same input, as many classes) is
tests/test_model_release_unit.py's.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import onnx
import pytest

from app.served_model import ModelFiles
from app.storage import sha256_file
from app.toolchain.samples import sample_bytes
from tests.conftest import ServeDeployer, deployment, local_config, wait_until

pytestmark = pytest.mark.slow


class Load:
    """Concurrent clients sending single images to the INT8 variant until stopped; every reply's status counted."""

    def __init__(self, url: str, image: bytes, clients: int = 4) -> None:
        self.url, self.image = url, image
        self.stop = threading.Event()
        self.statuses: Counter[int] = Counter()
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self.stop.is_set():
                try:
                    r = c.post(
                        self.url + "/v1/classify",
                        content=self.image,
                        headers={"content-type": "image/jpeg", "X-Model-Variant": "int8"},
                    )
                    status, body = r.status_code, r.text[:200]
                except httpx.HTTPError as e:
                    status, body = 0, repr(e)
                with self.lock:
                    self.statuses[status] += 1
                    if status != 200:
                        self.errors.append(f"{status} {body}")

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        wait_until(lambda: sum(self.statuses.values()) >= 4, 60, what="the load's first replies")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def served(self) -> int:
        with self.lock:
            return sum(self.statuses.values())


def int8_version(url: str) -> dict[str, Any]:
    return httpx.get(url + "/v1/models", timeout=10).json()["variants"]["int8"]["model_version"]


@pytest.fixture
def release(local_app: ServeDeployer, model_files: ModelFiles) -> Any:
    """Deploys configs/local.yaml with Classifier_int8's user_config naming a model version (the config as the test
    session deployed it again afterwards)."""
    base = local_config(model_files)

    def deploy(user_config: dict[str, Any]) -> None:
        cfg = copy.deepcopy(base)
        deployment(cfg, "Classifier_int8")["user_config"].update(user_config)
        from ray.serve.schema import ServeDeploySchema

        local_app.client.deploy_apps(
            ServeDeploySchema.model_validate(
                {k: v for k, v in cfg.items() if k not in ("http_options", "grpc_options")}
            )
        )

    yield deploy
    deploy({})
    wait_until(lambda: int8_version(local_app.url)["serving"]["files"][0]["uri"] == str(model_files.int8), 120)
    local_app.wait_running()


def another_version(model: Path, directory: Path) -> Path:
    m = onnx.load(str(model))
    m.producer_version = (m.producer_version or "") + "+release-test"
    out = directory / "efficientnet_lite0-int8-v2.onnx"
    onnx.save(m, str(out))
    return out


def test_a_release_in_place_under_load_loses_nothing(
    local_app: ServeDeployer, model_files: ModelFiles, release: Any, tmp_path: Path
) -> None:
    url = local_app.url
    jpeg = sample_bytes("coffee")
    before = int8_version(url)
    assert before["state"] == "serving" and before["serving"]["version"] == sha256_file(model_files.int8)
    replica = httpx.get(url + "/v1/models").json()["variants"]["int8"]["replica_id"]
    new_file = another_version(model_files.int8, tmp_path)
    new, digest = str(new_file), sha256_file(new_file)
    assert digest != before["serving"]["version"]

    with Load(url, jpeg) as load:
        release({"model_path": new, "sha256": digest})
        now = wait_until(
            lambda: (v := int8_version(url))["serving"]["version"] == digest and v,
            180,
            what="Classifier_int8 serving the new version",
        )
        served_at_switch = load.served()
        wait_until(lambda: load.served() >= served_at_switch + 8, 60, what="replies after the switch")
    assert load.errors == [] and load.statuses[200] == load.served(), load.errors[:5]
    assert now["state"] == "serving" and now["serving"]["files"][0]["uri"] == new
    models = httpx.get(url + "/v1/models").json()["variants"]["int8"]
    assert models["replica_id"] == replica  # the same replica, reconfigured: no restart
    assert now["serving"]["files"][0]["downloaded"] is False  # a local file: checked in place, not copied

    # A wrong digest: refused with one line, the version that serves stays, nothing lost meanwhile.
    with Load(url, jpeg) as load:
        release({"model_path": str(model_files.int8), "sha256": "0" * 64})
        failed = wait_until(
            lambda: (v := int8_version(url))["state"] == "failed" and v, 180, what="the release refused"
        )
    assert load.errors == [], load.errors[:5]
    assert failed["serving"]["version"] == digest
    assert "sha256 mismatch" in failed["error"] and str(model_files.int8) in failed["error"]
    assert failed["target"] == {"uri": str(model_files.int8), "sha256": "0" * 64}

    # A malformed version (not a digest): refused the same way, the replica neither fails nor restarts.
    release({"model_path": str(model_files.int8), "sha256": "abc"})
    malformed = wait_until(
        lambda: (v := int8_version(url))["state"] == "failed" and "64 hex digits" in (v["error"] or "") and v,
        120,
        what="the malformed version refused",
    )
    assert malformed["serving"]["version"] == digest
    assert httpx.get(url + "/v1/models").json()["variants"]["int8"]["replica_id"] == replica
