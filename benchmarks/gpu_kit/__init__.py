"""A kit for a GPU node without network: everything the node lacks to run the GPU checks and the served app, in parts
that arrive one call at a time.

    python -m benchmarks.gpu_kit build DIR [--python-version 3.12] [--part-mib 48] [--node-has NAME,...]
                                           [--models DIR] [--wheels DIR]
    bash DIR/run.sh receive [FROM_DIR]      # on the node, once per arriving part (its folder vanishes after)
    bash DIR/run.sh run [--cpu-dry-run] [-- gpu_serve's args]   # once all are stored: assemble, check, run

Such a node (the first GPU contact, ../shared/gpu-2026-12-04/README.md) reaches no package index, receives a copy
of this checkout plus a few folders per call, 64 MiB in all, and keeps only /root between calls. So the kit is one
xz-compressed tar cut into parts of at most 48 MiB (pack.py), each stored under ${APP_KIT_HOME:-/root/app-gpu-kit}
by run.sh as it arrives (its SHA-256 checked against manifest.json), unpacked once all are there. Inside:

    kit.json    the build's id, the target Python, the project's runtime requirements (run.sh checks them there)
    site/       the Python distributions the node lacks, unpacked for its CPython (wheels.py, closure.py)
    project/    this working tree's files that git tracks or does not ignore (contents.py)
    models/     the fp32, int8-trt and fp16 models (int8, the CPU build, for the dry runs), labels, quality reports
    bin/ libexec/ lib/   wrk and the shared libraries it needs (only wrk sees lib/: contents.py says why)

Left out, each for a reason: the distributions the node already has (wheels.DEFAULT_NODE_HAS, from the GPU image's
package list; one of unknown version is carried all the same where a requirement names versions), those not needed
to serve on a GPU node (wheels.LEFT_OUT), bytecode (the node's Python writes its own), ONNX Runtime's C API library,
onnxruntime/capi/libonnxruntime.so.* (29 MB): the Python binding has the runtime linked in, and at every build
prune.py proves that no ELF file of the site NEEDs it (readelf -d) and no file names it, or keeps it; and Ray's Java
worker jars, ray/jars/ (34 MB): only a JVM loads them, and Ray starts none without them (prune.py says how that is
checked). run.sh puts the kit's site first on PYTHONPATH, so its onnxruntime-gpu shadows the node's CPU-only
onnxruntime, and the CUDA 13 / cuDNN 9 libraries of the node's own `nvidia` pip packages on LD_LIBRARY_PATH
(node.py).
"""
