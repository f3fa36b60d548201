"""The HTTP layer: reading and checking requests (reading), the replies (replies), the v1 and V2 handlers.

Dependencies point one way: deployments -> http -> pipeline -> the pure cores. `reading` is pure
(no Ray, no Starlette) so the benchmark peers answer requests by the very same rules.
"""
