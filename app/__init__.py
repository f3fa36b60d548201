"""Image classification on Ray Serve: CPU preprocessing, batched ONNX Runtime inference, INT8/FP32 A/B."""

__version__ = "0.1.0"
