"""The HTTP and gRPC layer: the route table and body gate (ingress), request reading (reading), the replies
(replies), the v1, V2 and gRPC handlers, /docs and /openapi.json, the admission front's report.

Dependencies point one way: serve -> http -> protocol, pipeline -> the cores (docs/architecture.md). `reading` is pure
(no Ray, no Starlette) so the benchmark peers answer requests by the very same rules.
"""
