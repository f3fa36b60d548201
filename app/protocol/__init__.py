"""The Open Inference Protocol (KServe V2): request parsing and the parse pool, response encoding, model metadata,
Triton's model configuration, and the gRPC mapping. No Ray, no Starlette."""
