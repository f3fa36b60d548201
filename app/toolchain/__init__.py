"""The offline model toolchain: build the built-in model from its ImageNet weights (build.py, efficientnet.py,
weights.py), quantize any model to INT8 as its config declares it (quantize.py, calibration.py, qdq_placement.py,
samples.py) or convert it to FP16 (fp16.py), and report what the build costs and buys (report.py).

Its command line is `python -m app.models` (`app.models.cli`):

    python -m app.models build      # the built-in FP32 EfficientNet-Lite0 from the ImageNet weights, plus labels
    python -m app.models quantize --model FP32.onnx --config CONFIG.yaml --output INT8.onnx
                                    # INT8 by post-training static quantization, calibrated on images prepared as
                                    # CONFIG's args.model declares; then OUT's report (INT8.report.{json,md})
    python -m app.models quantize ... --target tensorrt   # the symmetric S8S8 INT8 that TensorRT can build
    python -m app.models quantize ... --target fp16       # FP16 for the CUDA EP on a GPU without TensorRT
    python -m app.models report --model FP32.onnx --int8 BUILD.onnx --config CONFIG.yaml   # --build: the same flag

What the service itself needs of a model at serving time is `app.served_model`.
"""
