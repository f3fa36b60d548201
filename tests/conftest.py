"""Shared fixtures. Tiers: pure unit tests (no Ray), one real Ray cluster per session for the app,
and a few multi-node `ray.cluster_utils.Cluster` tests (marked `cluster`) that make their own."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from app.imaging.transform import Transform
from app.served_model import ModelFiles, default_files

REPO = Path(__file__).resolve().parent.parent


def ensure_default_models(files: ModelFiles) -> ModelFiles:
    """Build FP32 and INT8 once (idempotent); later sessions reuse them."""
    from app.toolchain.build import build_fp32
    from app.toolchain.quantize import QuantizeOptions, quantize
    from app.toolchain.samples import augmented_samples

    build_fp32(files)
    if not files.int8.is_file():
        quantize(files.fp32, files.int8, augmented_samples(64, 0), QuantizeOptions())
    return files


@pytest.fixture(scope="session")
def model_files() -> ModelFiles:
    """The default FP32/INT8 models and labels, in the repository's models/ directory."""
    return ensure_default_models(default_files(REPO / "models"))


# --------------------------------------------------------------------------- one Ray cluster per session

import contextlib  # noqa: E402
import copy  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator, Mapping  # noqa: E402
from typing import Any  # noqa: E402

import yaml  # noqa: E402

from benchmarks.server_process import free_port  # noqa: E402, F401 (the tests' import of it)

SERVE_PORT = int(os.environ.get("TEST_SERVE_PORT", "18000"))
METRICS_PORT = int(os.environ.get("TEST_METRICS_PORT", "18080"))
GRPC_PORT = SERVE_PORT + 95  # past app.front.instance.private_serve_env's own +93 and +94
APP_NAME = "classifier"


def load_config(name: str) -> dict[str, Any]:
    with open(REPO / "configs" / name) as f:
        return yaml.safe_load(f)


def local_config(model_files: ModelFiles, **router_overrides: Any) -> dict[str, Any]:
    """configs/local.yaml with absolute model paths and the test port; deployment tweaks by the caller."""
    cfg = copy.deepcopy(load_config("local.yaml"))
    cfg["http_options"]["port"] = SERVE_PORT
    cfg["grpc_options"]["port"] = GRPC_PORT
    app = cfg["applications"][0]
    app["args"]["variants"]["int8"]["model_path"] = str(model_files.int8)
    app["args"]["variants"]["fp32"]["model_path"] = str(model_files.fp32)
    # Beside local.yaml's auto cascade, two fixed ones: every image on to FP32, and none (tests/test_app.py).
    app["args"]["cascades"] |= {
        "int8>fp32-all": {"first": "int8", "then": "fp32", "margin": 1.0},
        "int8>fp32-none": {"first": "int8", "then": "fp32", "margin": 0.0},
    }
    router = deployment(cfg, "Router")
    router["user_config"].update(router_overrides)
    return cfg


def deployment(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    return next(d for d in cfg["applications"][0]["deployments"] if d["name"] == name)


def wait_until(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.2, what: str = "") -> Any:
    """Poll `predicate` until it returns something truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as e:  # the thing polled may not exist yet
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}: last={last!r}")


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """`values` in this process's environment for the `with` block, and the environment as it was once it ends (a
    variable it lacked removed again): what a fixture sets ends with the fixture, and no later test sees it."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield dict(values)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def use_serve_env(port: int) -> contextlib.AbstractContextManager[dict[str, str]]:
    """configs/serve.env in this process's environment for a `with` block (restored when it ends): the Ray processes
    started in it inherit it, and keep it (a raylet, and every worker it starts, has the environment it started with).

    The tests run the Serve runtime `make serve` and the RayService run (HAProxy ingress, throughput-
    optimised mode), with HAProxy's files and stats ports private to this session.
    """
    from app.front.instance import private_serve_env

    env = private_serve_env(port)
    # A Router replica that stops (a redeploy, a deleted app, one that failed to start) is held open 30 s by default
    # so that an external load balancer can deregister it (Serve's direct ingress); here nothing outside this machine
    # routes to it and HAProxy retries refused connections: 3 s, not the ~30 s each such stop cost a test before.
    env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] = "3"
    return environment(env)


def driver_handle(deployment_name: str, app_name: str | None = None) -> Any:
    """A handle usable from the (synchronous) test process.

    RAY_SERVE_THROUGHPUT_OPTIMIZED runs a handle's router on the caller's event loop, which a plain
    test function does not have; a driver handle therefore asks for Serve's router thread.
    """
    from ray import serve

    from app.serve.serve_internals import init_handle_on_router_thread

    handle = serve.get_deployment_handle(deployment_name, app_name=app_name or APP_NAME)  # cached: the same again
    if not handle.is_initialized:
        init_handle_on_router_thread(handle)
    return handle


@pytest.fixture(scope="session")
def ray_session() -> Iterator[dict[str, str]]:
    """The session's Ray, started with configs/serve.env (use_serve_env) in its environment; that environment.

    The variables are in this process's environment while Ray starts (its processes keep them) and while a test on
    this Ray runs (`serve_env_in_ray_tests`), nowhere else: a unit test sees the environment it would see alone,
    wherever it runs in the suite."""
    import ray

    with use_serve_env(SERVE_PORT) as env:
        # Serve's settings (RAY_SERVE_THROUGHPUT_OPTIMIZED, ...) are read when ray.serve is first imported: here, so
        # that this driver's are the session's, as its Ray processes' are.
        import ray.serve

        # Logical CPUs above the 2 real cores: the configs use fractional shares that must all fit.
        ray.init(
            num_cpus=6,
            include_dashboard=False,
            namespace="serve",
            log_to_driver=False,
            _metrics_export_port=METRICS_PORT,
        )
    yield env
    from ray import serve

    with environment(env):
        serve.shutdown()
    ray.shutdown()


@pytest.fixture(autouse=True)
def serve_env_in_ray_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test on the session's Ray sees its configs/serve.env in this process's environment, as the Ray processes do
    (it may read a variable, or start a process that inherits them), restored after it; any other test sees none of
    it (tests/test_conftest_env_unit.py)."""
    if "ray_session" not in request.fixturenames:
        yield
        return
    with environment(request.getfixturevalue("ray_session")):
        yield


class ServeDeployer:
    """Deploys Serve configs the way `serve run <config>` / `serve deploy` do (controller.apply_config)."""

    def __init__(self) -> None:
        from ray import serve

        from app.serve.serve_internals import serve_client

        grpc = load_config("local.yaml")["grpc_options"]
        serve.start(
            http_options={"host": "127.0.0.1", "port": SERVE_PORT},
            grpc_options={**grpc, "port": GRPC_PORT},
            proxy_location="HeadOnly",
        )
        self.client = serve_client()
        self.grpc_url = f"127.0.0.1:{GRPC_PORT}"
        self.url = f"http://127.0.0.1:{SERVE_PORT}"
        self.current: dict[str, Any] | None = None

    def deploy(self, cfg: dict[str, Any], timeout_s: float = 180) -> None:
        from ray.serve.schema import ServeDeploySchema

        schema = ServeDeploySchema.model_validate(
            {k: v for k, v in cfg.items() if k not in ("http_options", "grpc_options", "proxy_location")}
        )
        self.client.deploy_apps(schema)
        self.current = copy.deepcopy(cfg)
        self.wait_running(timeout_s)

    def status(self) -> Any:
        from ray import serve

        return serve.status().applications.get(APP_NAME)

    def wait_running(self, timeout_s: float = 180) -> None:
        import httpx

        def running() -> bool:
            st = self.status()
            if st is not None and st.status == "DEPLOY_FAILED":
                raise AssertionError(f"deploy failed: {st.message}")
            if st is None or st.status != "RUNNING":
                return False
            if any(d.status != "HEALTHY" for d in st.deployments.values()):
                return False
            return httpx.get(self.url + "/readyz", timeout=5).status_code == 200

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if running():
                    return
            except AssertionError:
                raise
            except Exception:
                pass
            time.sleep(0.25)
        raise AssertionError(f"app not RUNNING and ready after {timeout_s}s: {self.status()}")


@pytest.fixture(scope="session")
def serve_deployer(ray_session: dict[str, str]) -> ServeDeployer:
    return ServeDeployer()


class PythonProxyApp:
    """configs/local.yaml as `serve run` starts it on a plain Ray cluster: a child process with a Ray of its own, and
    none of configs/serve.env in its environment (the session's Ray has it), so Serve's default ingress, its Python
    proxy, answers HTTP and gRPC. ~60 s to start on 2 cores; stopped by pid."""

    def __init__(self, model_files: ModelFiles, directory: Path) -> None:
        from benchmarks.server_process import ServerProcess

        port = SERVE_PORT + 300  # past the session's ranges (app.front.instance.private_serve_env: 50 apart is enough)
        cfg = local_config(model_files)
        cfg["http_options"]["port"], cfg["grpc_options"]["port"] = port, port + 95
        path = directory / "local-python-proxy.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.url, self.grpc_url = f"http://127.0.0.1:{port}", f"127.0.0.1:{port + 95}"
        self.server = ServerProcess(
            "serve-python-proxy",
            [str(Path(sys.executable).parent / "serve"), "run", str(path)],
            directory / "serve-python-proxy.log",
            cwd=REPO,
            env={"RAY_ADDRESS": "local"},  # a Ray of its own, never the session's or anyone else's
            unset=lambda k: k.startswith(("RAY_SERVE_", "APP_FRONT_")),  # what use_serve_env put in this process
            fail_patterns=("DEPLOY_FAILED", r"Deploying app '[^']*' failed"),  # as benchmarks.run's
        )

    def __enter__(self) -> PythonProxyApp:
        from benchmarks.server_process import port_open

        # A leftover server from an aborted run must not answer in this one's place (nor make it wait for a port).
        taken = [u for u in (self.url, "http://" + self.grpc_url) if port_open(u)]
        if taken:
            raise RuntimeError(f"something already listens at {taken}: a serve run left by an earlier test run?")
        self.server.start()
        try:
            self.server.wait_ready(self.url + "/readyz", 240)
        except BaseException:
            self.server.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    def log(self) -> str:
        return self.server.log_path.read_text(errors="replace")


@pytest.fixture(scope="session")
def local_app(serve_deployer: ServeDeployer, model_files: ModelFiles) -> ServeDeployer:
    """configs/local.yaml deployed once; tests that change it must restore it (see `redeploy`)."""
    serve_deployer.deploy(local_config(model_files))
    return serve_deployer


class BlockingDecode:
    """Stands in for `app.imaging.preprocess.preprocess` (monkeypatched into app.serve.preprocessor): each call
    records the image's size, says it started, and blocks its decode thread until `release` is set; then a black
    image."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self, data: bytes, transform: Transform, *rest: object) -> np.ndarray:
        self.calls.append(len(data))
        self.started.set()
        self.release.wait(30)
        return np.zeros(transform.shape, np.uint8)
