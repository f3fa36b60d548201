"""The LitServe peer as run.py runs it: its own process tree on a free loopback port, the app's v1 answers, and a
SIGINT that leaves none of its processes behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import psutil
import pytest

from app.served_model import ModelFiles
from benchmarks.corpus import CorpusImage, build_corpus
from benchmarks.load import multipart_body
from tests.conftest import REPO, free_port, wait_until


@pytest.fixture(scope="module")
def peer(model_files: ModelFiles) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    cmd = [sys.executable, "-m", "benchmarks.baselines.litserve_peer", "--port", str(port), "--device", "cpu"]
    cmd += ["--workers", "1"]  # two inference processes, not four: a quicker start
    env = {**os.environ, "APP_MODEL_DIR": str(model_files.root)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{url}/healthz", timeout=1).status_code == 200, 60, what="the LitServe peer")
        yield url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # only when the test failed before its own SIGINT


def test_litserve_peer_answers_like_the_app_and_stops_cleanly(peer: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, proc = peer
    photo = build_corpus(((320, 240),))[0].data
    with httpx.Client(base_url=url, timeout=30) as client:
        r = client.post("/v1/classify?top_k=2", content=photo, headers={"Content-Type": "image/jpeg"})
        assert r.status_code == 200 and r.headers["X-Model-Variant"] == "fp32"
        assert len(r.json()["predictions"]) == 2 and r.json()["timings_ms"]["batch_size"] >= 1
        r = client.post("/v1/classify", content=b"not an image", headers={"Content-Type": "image/jpeg"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "undecodable_image"
        body, headers = multipart_body([CorpusImage("ok", 1, 1, photo), CorpusImage("bad", 1, 1, b"not an image")])
        ok, bad = client.post("/v1/classify/batch", content=body, headers=headers).json()["results"]
        assert ok["variant"] == "fp32" and bad["error"]["code"] == "undecodable_image"
    family = psutil.Process(proc.pid).children(recursive=True)
    assert family, "LitServe runs its servers and workers as child processes"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    _, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, f"left behind: {alive}"
