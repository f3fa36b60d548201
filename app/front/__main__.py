"""`python -m app.front env CONFIG [APPLICATION]` (the front's variables from a config) and `status URL` (whether the
front is in place before the app at URL)."""

import sys

from app.front import print_env, print_status

if __name__ == "__main__":
    match sys.argv[1:2]:
        case ["env"]:
            sys.exit(print_env(sys.argv[2:]))
        case ["status"] if len(sys.argv) == 3:
            sys.exit(print_status(sys.argv[2].rstrip("/")))
    sys.exit("usage: python -m app.front env CONFIG.yaml [APPLICATION] | status URL  (HAProxy runs as `app-haproxy`)")
