"""`python -m app.ops capacity CONFIG ...`: a thin face; the command is `app.ops.capacity`. The other tools here run
as modules of their own (`python -m app.ops.k8s`, `app.ops.panels`, `app.ops.config_reference`, `app.ops.proto_gen`)."""

import sys

COMMANDS = {"capacity": "how many Preprocessor replicas (CPU cores) one GPU's Classifier needs for an image mix"}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        listed = "\n".join(f"  {name:10} {what}" for name, what in COMMANDS.items())
        print(f"usage: python -m app.ops COMMAND ...\n\ncommands:\n{listed}", file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    from app.ops.capacity import main as capacity

    return capacity(args[1:])


if __name__ == "__main__":
    sys.exit(main())
