"""The served app measured on one GPU node: `python -m benchmarks.gpu_serve` (`--cpu-dry-run` here, on the CPUs).

Why a package of its own: the run has one concept per module, each testable without Ray (tests/test_gpu_serve_unit.py)
but the node (`node`), which starts and stops the real thing.

    shape       the served config derived from configs/prod.yaml: model paths re-pointed, fixed replica counts
    node        Ray started as docs/operating.md "A Ray cluster of your own" says (serve.env, the admission front),
                serve deploy, readiness, stop
    timing      the Server-Timing header: parsed, and its stages summarised
    groups      processes named by group (Routers, Preprocessors, each Classifier, HAProxy, Serve, Ray, wrk), CPU deltas
    gpu         the GPU count and the nvidia-smi sampler that runs beside each throughput step
    steps       the load: wrk throughput steps and the c=1 Server-Timing client
    verdict     the engine's own rate (gpu_check's result) and which stage holds a missed target back
    report      JSON, Markdown and the plot
    run         the command line and the order of it all
"""
