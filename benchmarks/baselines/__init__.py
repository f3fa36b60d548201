"""Peers the app is measured against, each serving the app's contract as `python -m benchmarks.baselines.<name>
--port N`: fastapi_onnx, litserve_peer, serve_single and serve_echo the v1 HTTP contract (POST /v1/classify, GET
/healthz); triton_peer the Open Inference Protocol (Triton through PyTriton, in its own venv: see its docstring)."""
