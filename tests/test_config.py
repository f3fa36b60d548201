"""Typed configuration: bad values fail naming the field; the shipped configs are valid."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.config import (
    SERVE_ENV,
    AppArgs,
    ClassifierConfig,
    RouterConfig,
    read_serve_env,
    validate_serve_config,
)
from app.front.instance import private_haproxy_env, private_serve_env
from tests.conftest import REPO, deployment, load_config


@pytest.mark.parametrize("name", ["local.yaml", "prod.yaml"])
def test_shipped_configs_validate(name: str) -> None:
    args = validate_serve_config(load_config(name))
    assert set(args.variants) == {"int8", "fp32"}


def test_the_front_is_checked_against_the_router_it_stands_before() -> None:
    cfg = load_config("local.yaml")
    cfg["applications"][0]["args"]["front"]["queue_timeout_s"] = 10
    with pytest.raises(ValueError, match=r"args.front.queue_timeout_s \(10.0\) must be below .*inference_timeout_s"):
        validate_serve_config(cfg)
    cfg = load_config("local.yaml")
    cfg["applications"][0]["args"]["front"]["maxconn_per_replica"] = 5000
    with pytest.raises(ValueError, match=r"args.front.maxconn_per_replica \(5000\) exceeds .*max_ongoing_requests"):
        validate_serve_config(cfg)
    with pytest.raises(ValueError, match="buffer_bytes"):
        AppArgs.model_validate({"front": {"buffer_bytes": 100}})


@pytest.mark.parametrize("name", ["efficientnet-lite1.yaml", "imagenet-nchw.yaml"])
def test_the_example_configs_of_your_own_model_validate(name: str) -> None:
    import yaml

    args = validate_serve_config(yaml.safe_load((REPO / "configs" / "examples" / name).read_text()))
    assert args.model.name != "efficientnet_lite0" and not args.build_default_models
    assert args.model.preprocess.crop == "center" and len(args.model.preprocess.mean) == 3


def test_cli_checks_files() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "app.config", "configs/local.yaml", "configs/prod.yaml", "configs/serve.env"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(": ok") == 3


def test_serve_env_is_read_as_key_value_lines(tmp_path: Path) -> None:
    assert read_serve_env(SERVE_ENV) == {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": "30",
        "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
        "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
        "RAY_SERVE_HAPROXY_NBTHREAD": "1",
        "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": "201326592",
        "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE": "16777216",
    }
    f = tmp_path / "x.env"
    f.write_text("# comment\n\nA_B=1\n  C=/tmp/x  \nEMPTY=\n")
    assert read_serve_env(f) == {"A_B": "1", "C": "/tmp/x", "EMPTY": ""}


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("export A=1", "2: expected KEY=VALUE"),
        ('A="1"', "2: expected KEY=VALUE"),
        ("A=1 2", "2: expected KEY=VALUE"),
        ("a=1", "2: expected KEY=VALUE"),
        ("A=1\nA=2", "3: A is set twice"),
        ("APP_FRONT_QUEUE_TIMEOUT_S=4", "2: APP_FRONT_QUEUE_TIMEOUT_S is the admission front's, set in the app config"),
    ],
)
def test_serve_env_refuses_what_make_python_and_kubernetes_would_read_differently(
    tmp_path: Path, line: str, fragment: str
) -> None:
    f = tmp_path / "bad.env"
    f.write_text("# ok\n" + line + "\n")
    with pytest.raises(ValueError, match=fragment) as e:
        read_serve_env(f)
    assert str(e.value).startswith(f"{f}:")  # names the file and the line


def test_the_serve_env_file_means_the_same_to_a_posix_shell() -> None:
    shell = subprocess.run(
        ["sh", "-c", f"set -a && . {SERVE_ENV} && env"], capture_output=True, text=True, check=True, env={}
    ).stdout
    from_shell = dict(line.split("=", 1) for line in shell.splitlines() if "=" in line)
    assert {k: from_shell.get(k) for k in read_serve_env()} == read_serve_env()


def test_private_haproxy_env_fits_haproxys_socket_path_limit() -> None:
    a, b = private_haproxy_env(8000), private_haproxy_env(8000)
    assert a["RAY_SERVE_HAPROXY_SOCKET_PATH"] != b["RAY_SERVE_HAPROXY_SOCKET_PATH"]  # one directory each
    # HAProxy nests the socket in a 56-character directory and refuses paths over 97 bytes.
    assert len(a["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"]) + 1 + 56 + len("/admin.sock") <= 97
    assert (a["RAY_SERVE_HAPROXY_STATS_PORT"], a["RAY_SERVE_HAPROXY_METRICS_PORT"]) == ("8091", "8092")


@pytest.mark.parametrize(
    "weights, fragment",
    [
        ({"int8": -1, "fp32": 1}, "weights must be >= 0"),
        ({"int8": 0, "fp32": 0}, "at least one weight must be positive"),
    ],
)
def test_bad_weights_name_the_field(weights: dict[str, float], fragment: str) -> None:
    with pytest.raises(ValidationError) as e:
        RouterConfig(weights=weights)
    assert "weights" in str(e.value) and fragment in str(e.value)


def test_unknown_fields_are_errors() -> None:
    with pytest.raises(ValidationError, match="max_batch"):
        ClassifierConfig.model_validate({"max_batch": 8})
    with pytest.raises(ValidationError, match="weight"):
        RouterConfig.model_validate({"weights": {"a": 1}, "weight": 3})


def test_batch_larger_than_max_ongoing_requests_is_refused() -> None:
    cfg = load_config("local.yaml")
    deployment(cfg, "Classifier_fp32")["user_config"]["max_batch_size"] = 64
    with pytest.raises(
        ValueError, match=r"deployments\[Classifier_fp32\].*max_batch_size \(64\).*max_ongoing_requests \(32\)"
    ):
        validate_serve_config(cfg)


def test_weights_for_unknown_variants_are_refused() -> None:
    cfg = copy.deepcopy(load_config("local.yaml"))
    deployment(cfg, "Router")["user_config"]["weights"] = {"int4": 1}
    with pytest.raises(ValueError, match=r"weights: unknown variants or cascades \['int4'\]"):
        validate_serve_config(cfg)


def test_app_args_validation() -> None:
    with pytest.raises(ValidationError, match="variants"):
        AppArgs.model_validate({"variants": {}})
    with pytest.raises(ValidationError, match="device"):
        AppArgs.model_validate({"device": "tpu"})
    with pytest.raises(ValidationError, match="default_top_k"):
        AppArgs.model_validate({"limits": {"default_top_k": 30, "max_top_k": 20}})


def test_private_serve_env_gives_each_instance_its_own_replica_ports() -> None:
    # Replica ports are bound with SO_REUSEPORT: two instances sharing a range share traffic.
    def ranges(port: int) -> list[range]:
        env = private_serve_env(port)
        return [
            range(
                int(env[f"RAY_SERVE_DIRECT_INGRESS_MIN_{kind}_PORT"]),
                int(env[f"RAY_SERVE_DIRECT_INGRESS_MAX_{kind}_PORT"]) + 1,
            )
            for kind in ("HTTP", "GRPC")
        ]

    ports = [8000, 8101, 8200, 18000, 18100]  # make serve, a bench target, the soak, the test clusters
    for a in ports:
        for b in ports:
            if a != b:
                assert all(not set(x) & set(y) for x in ranges(a) for y in ranges(b)), (a, b)
    # ... and so is the fallback proxy HAProxy uses while no Router is up (8500/9500 by default).
    fallback = {private_serve_env(p)[f"RAY_SERVE_FALLBACK_PROXY_{k}_PORT"] for p in ports for k in ("HTTP", "GRPC")}
    assert len(fallback) == 2 * len(ports) and not fallback & {"8500", "9500"}
    env = private_serve_env(18000)
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and "RAY_SERVE_HAPROXY_SOCKET_PATH" in env
    assert "RAY_SERVE_HAPROXY_SOCKET_PATH" not in private_serve_env(18000, {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"})
