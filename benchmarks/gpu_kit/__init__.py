"""A kit for a GPU node without network: everything the node lacks to run the GPU checks and the served app, in call
folders sized to what one call to a lent machine may carry, with the plan of those calls.

    python -m benchmarks.gpu_kit aside                        # benchmarks/results/ out of what every call carries
    python -m benchmarks.gpu_kit build DIR [--python-version 3.12] [--node-has NAME,...] [--models DIR] [--wheels DIR]
    python -m benchmarks.gpu_kit plan DIR                     # the plan against the checkout as it is now
    bash DIR/call-N/run.sh call DIR/call-N                    # on the node, one call per folder, in order
    bash /root/app-gpu-kit/run.sh run [PHASES] [--cpu-dry-run] [-- gpu_serve's args]   # a phase again
    python -m benchmarks.gpu_kit back                         # benchmarks/results/ as it was

Such a node (a lent machine: ../shared/gpu-2026-12-04/README.md, the device tool's limits) reaches no package index,
receives a copy of the checkout plus the folders a call names, 64 MiB in all, runs one command for at most 600 s,
returns at most 8 files from $OUT, keeps /root only while it stays warm (30 s after a call), and is lent for 15
minutes in all. So the kit is two segments (segments.py): the engines (the project, the models, ONNX Runtime,
nvImageCodec, pydantic) first, then serving (Ray with Serve and its requirements, wrk); each segment is xz streams
(pack.py) whose concatenation is cut into parts as large as one call can carry beside the checkout as it travels
(plan.py), one part per call folder with run.sh and manifest.json. run.sh stores each part under
${APP_KIT_HOME:-/root/app-gpu-kit} (SHA-256 checked), unpacks a segment as soon as its parts are all there, and runs
what that allows (runner.py): gpu_check and gpu_decode once the engines are in, gpu_serve once everything is, each
step under a timeout that fits the command, each step's results archived into $OUT as it ends. Inside the segments:

    kit.json    the build's id, the target Python, the runtime requirements, the engines' apart (run.sh checks them)
    site/       the Python distributions the node lacks, unpacked for its CPython (wheels.py, closure.py)
    project/    this working tree's files that git tracks or does not ignore, but benchmarks/results/ (contents.py)
    models/     the fp32, int8-trt and fp16 models, labels, quality reports (--cpu-int8: the CPU INT8 build too)
    bin/ libexec/ lib/   wrk and the shared libraries it needs (only wrk sees lib/: contents.py says why)

Left out, each for a reason: the distributions the node already has (wheels.DEFAULT_NODE_HAS, from the GPU image's
package list; one of unknown version is carried all the same where a requirement names versions), those not needed
to serve on a GPU node (wheels.LEFT_OUT) and Ray Data with pyarrow and pandas (wheels.EXTRAS_LEFT_OUT: app/batch's),
bytecode (the node's Python writes its own), and what prune.py proves no step loads: ONNX Runtime's C API library,
Ray's Java worker jars, extension modules built for other CPythons (nvImageCodec ships one per version), py-spy's
binary. run.sh puts the kit's site first on PYTHONPATH, so its onnxruntime-gpu shadows the node's CPU-only
onnxruntime, and the CUDA 13 / cuDNN 9 libraries of the node's own `nvidia` pip packages on LD_LIBRARY_PATH
(node.py).
"""
