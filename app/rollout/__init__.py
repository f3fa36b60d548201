"""Canary rollouts decided on live A/B evidence: anytime-valid bounds (bounds.py), the request (spec.py), the
evidence (evidence.py), the rules (decide.py) and the state machine (state.py). Pure: no Ray, no Starlette, so
the rules are unit-tested and simulated without a cluster. The controller deployment around them is not built yet."""
