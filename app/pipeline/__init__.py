"""What happens to an accepted image: admission, coalescing, failover, shadowing; pure asyncio.

No module here imports ray or starlette (tests/test_layering.py enforces it): the deployments
come in as a `Backend` (ports.py), so the whole pipeline runs in unit tests with fakes.

    admission.py  the in-flight limit: a fast 503 instead of a queue
    coalescer.py  concurrent requests for one variant share one trip down the chain
    failover.py   deadline, one retry elsewhere, abandon a call whose variant lost its replicas
    shadow.py     a sample re-run on the other variant off the response path; the A/B evidence
    service.py    classify(...) -> Outcome: the above put together
"""
