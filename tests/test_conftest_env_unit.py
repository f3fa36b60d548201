"""What a fixture of tests/conftest.py puts in this process's environment ends with the fixture: a unit test sees the
environment it would see alone, wherever it runs in the suite (after the session's Ray started, or a cluster test's).
No Ray."""

from __future__ import annotations

import os

import pytest

from tests.conftest import environment, free_port, use_serve_env

SERVE_PREFIXES = ("RAY_SERVE_", "APP_FRONT_")


def serve_variables() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(SERVE_PREFIXES)}


# Read when pytest imports this file, before any fixture has run.
AT_COLLECTION = serve_variables()


def test_a_unit_test_sees_no_serve_env_a_ray_fixture_set() -> None:
    assert serve_variables() == AT_COLLECTION


def test_environment_is_set_for_the_block_and_restored_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_ENV_KEPT", "before")
    monkeypatch.delenv("TEST_ENV_NEW", raising=False)
    with environment({"TEST_ENV_KEPT": "inside", "TEST_ENV_NEW": "inside"}) as env:
        assert os.environ["TEST_ENV_KEPT"] == os.environ["TEST_ENV_NEW"] == "inside"
        assert env == {"TEST_ENV_KEPT": "inside", "TEST_ENV_NEW": "inside"}
    assert os.environ["TEST_ENV_KEPT"] == "before" and "TEST_ENV_NEW" not in os.environ
    with pytest.raises(RuntimeError), environment({"TEST_ENV_NEW": "inside"}):
        raise RuntimeError("a failing block restores it too")
    assert "TEST_ENV_NEW" not in os.environ


def test_use_serve_env_holds_configs_serve_env_only_inside_its_block() -> None:
    before = dict(os.environ)
    with use_serve_env(free_port()) as env:
        assert "RAY_SERVE_ENABLE_HA_PROXY" in env and all(os.environ[k] == v for k, v in env.items())
    assert dict(os.environ) == before


@pytest.fixture
def ray_session() -> dict[str, str]:
    """This module's stand-in for the session's Ray (tests/conftest.py's ray_session): the environment it yields."""
    return {"RAY_SERVE_TEST_STAND_IN": "1"}


def test_a_test_on_the_sessions_ray_sees_its_serve_env(ray_session: dict[str, str]) -> None:
    assert os.environ["RAY_SERVE_TEST_STAND_IN"] == "1"  # serve_env_in_ray_tests put it there


def test_and_the_next_test_does_not() -> None:
    assert "RAY_SERVE_TEST_STAND_IN" not in os.environ and serve_variables() == AT_COLLECTION
