"""``jaxengine`` command line: one sub-command per module in this package.

Each sub-command module defines ``register(subparsers)`` which adds its parser and
sets ``handler=`` to a function taking the parsed arguments and returning an exit code.
Modules are imported lazily by name so that ``jaxengine --help`` stays fast and a
sub-command's heavy imports (jax) happen only when it runs.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# Sub-command name -> module under jaxengine.cli. Add a line here when adding one.
SUBCOMMANDS: dict[str, str] = {
    "inspect": "inspect",
    "generate": "generate",
    "train": "train",
    "demo-base": "demo_base",
    "eval": "eval",
    "export": "export",
    "validate-data": "validate_data",
}


def command_description(docstring: str) -> str:
    """A sub-command's ``--help`` description: its module docstring's first paragraph, without the
    reStructuredText literal marks (``jaxengine inspect ...``: ...) that read as stray backticks there."""
    return docstring.split("\n\n")[0].replace("``", "").strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxengine", description="Temper's JAX post-training engine")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in dict.fromkeys(SUBCOMMANDS.values()):
        importlib.import_module(f"jaxengine.cli.{module_name}").register(subparsers)
    return parser


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse's top-level parser refused them as "jaxengine: error: ..." under the list of commands; the
        # command's own usage shows the flags it does take (a mistyped --jsn, a second spec file).
        subparsers = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
        subparsers.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C (train stops at a step itself): one line, not a traceback
        print(f"\njaxengine {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
