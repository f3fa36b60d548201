"""The wire protocols' own code, apart from their handlers (`app.http`): `v1`, the v1 JSON API's reply bodies as
typed models (the handlers build replies from them; /openapi.json is made from them), and `v2`, the Open Inference
Protocol (KServe V2): request parsing and the parse pool, response encoding, model metadata, Triton's model
configuration, and the gRPC mapping. No Ray, no Starlette."""
