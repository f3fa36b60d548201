"""Peers the app is measured against (fastapi_onnx, serve_single, serve_echo), each serving the app's HTTP
contract (POST /v1/classify, GET /healthz) as `python -m benchmarks.baselines.<name> --port N`."""
