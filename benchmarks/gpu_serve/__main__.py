"""`python -m benchmarks.gpu_serve`: see benchmarks/gpu_serve/run.py."""

import sys

from benchmarks.gpu_serve.run import main

if __name__ == "__main__":
    sys.exit(main())
