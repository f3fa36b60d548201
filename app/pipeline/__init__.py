"""What happens to an accepted image: admission, coalescing, failover, shadowing; pure asyncio.

No module here imports ray or starlette (import-linter enforces it, pyproject.toml): the deployments
come in as a `Backend` (ports.py), so the whole pipeline runs in unit tests with fakes.

    admission.py  the in-flight limit: a fast 503 instead of a queue
    coalescer.py  concurrent requests for one variant share one trip down the chain
    group_run.py  a sent group (or ready pixels): its variant under failover (each try an Attempt), a cascade's
                  second stage, the shadow; each request's share of the answer (Outcome)
    failover.py   deadline, one retry elsewhere, abandon a call whose variant lost its replicas
    shadow.py     a sample re-run on the other variant off the response path; the A/B evidence
    model_specs.py  the variants' input spec, transform and labels, asked of the Classifiers once
    service.py    classify(...) -> Outcome: the above put together
    routing.py    the variant a request goes to: override header > sticky hash > weighted draw
    cascade_rule.py  a cascade's rule (INT8 first, FP32 when the margin is thin) and its threshold's fit
    cascade_stage.py  each cascade's live state and its second stage
    capture.py    the cascade's disagreements kept for recalibration
    abstats.py, inferstats.py, intervals.py   the A/B ledger's and Triton's per-model statistics
"""
