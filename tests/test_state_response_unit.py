"""A state reply goes out through the schema /openapi.json documents it with (app.http.replies.state_response): the
fields it was given, validated; a body the schema refuses is logged as a drift and served as it is, never a 500."""

from __future__ import annotations

import json
import logging

import pytest

from app.http.replies import state_response
from app.protocol import v1


def test_a_state_body_goes_out_through_its_schema_with_the_fields_it_was_given() -> None:
    body = {"since": 1.5, "variants": {}, "pairs": {}, "model": "m"}
    reply = state_response(v1.ABSummary, body)
    assert reply.status_code == 200 and reply.media_type == "application/json"
    assert json.loads(reply.body) == body  # `serving` and `cascades` were not given: not sent as null either


def test_a_body_that_drifted_from_its_schema_is_logged_and_served_as_it_is(caplog: pytest.LogCaptureFixture) -> None:
    body = {"since": 1.5, "variants": {}, "pairs": {}, "undocumented": 1}
    with caplog.at_level(logging.ERROR, logger="ray.serve"):
        reply = state_response(v1.ABSummary, body)
    assert reply.status_code == 200 and json.loads(reply.body) == body
    assert "ABSummary does not fit its schema" in caplog.text and "undocumented" in caplog.text
