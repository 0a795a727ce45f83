"""Runs one of linrec's command-line tools: ``python -m linrec {bench,tune,info} [options]``; each tool's
``--help`` lists its options."""

from __future__ import annotations

import importlib
import sys

#: Subcommand -> what its tool (linrec/tools/<subcommand>.py) does.
TOOLS = {
    "bench": "throughput of linrec next to torch.add, forward and backward, over model layouts",
    "tune": "times every compiled CUDA kernel configuration on this GPU",
    "info": "prints what linrec was built for and what this machine runs",
}


def usage() -> str:
    tools = "\n".join(f"  {name:<6} {description}" for name, description in TOOLS.items())
    return f"usage: python -m linrec {{{','.join(TOOLS)}}} [options]\n\ntools:\n{tools}"


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if not argv or argv[0] not in TOOLS:
        problem = "no tool given" if not argv else f"unknown tool {argv[0]!r}"
        print(f"{usage()}\n\npython -m linrec: {problem}", file=sys.stderr)
        return 2
    importlib.import_module(f".tools.{argv[0]}", __package__).main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
