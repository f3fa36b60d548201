"""The HTTP and gRPC layer: the Router's parts put together (assembly), the one route table (routes) and its
dispatch (ingress), the live A/B policy (policy), the body (body_reader, through the gate of `app.request.body_gate`)
and a request's inputs (inputs), the replies (replies), the v1, V2 and gRPC handlers, /docs and /openapi.json, what the
Router reports of itself (report) and of the admission front (front_report).

Dependencies point one way: serve -> http -> protocol, pipeline -> the cores (docs/architecture.md). `inputs` is pure
(no Ray, no Starlette) so the benchmark peers answer requests by the very same rules.
"""
