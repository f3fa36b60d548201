"""Peers the app is measured against, each serving the app's HTTP contract (POST /v1/classify, GET /healthz):

- fastapi_onnx: one uvicorn process, ONNX Runtime called inline per request (the usual first version).
- serve_single: one Ray Serve deployment that decodes and infers, with @serve.batch.
- serve_echo:   Ray Serve's floor: reads the body and returns its length.

Each runs as `python -m benchmarks.baselines.<name> --port N`.
"""
