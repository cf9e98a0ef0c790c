"""`pdsim`: one entry point; each subcommand lives in `sim/commands/`.

Errors a user can cause (bad input, missing files, mismatched profiles) print one line and exit 2;
Ctrl-C exits 130 after whatever was measured has been saved.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ["simulate", "policies_cmd", "traces_cmd"]


class UserError(Exception):
    """An error to report in one line, without a traceback."""


def user_errors() -> tuple[type[BaseException], ...]:
    from policies import PolicyError
    from sim.costmodel import ProfileError
    from sim.files import ExistsError
    from sim.state import EngineError
    from traces.trace import TraceError
    return (UserError, PolicyError, ProfileError, ExistsError, TraceError, EngineError, FileNotFoundError,
            ValueError)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and still exit code 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="pdsim", description="Choose a prefill chunk budget and scheduling "
                                "policy: calibrate MLX kernels, simulate traces, confirm on the real engine.")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"sim.commands.{name}").add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    module = importlib.import_module(f"sim.commands.{_module_of(args.command)}")
    try:
        return module.run(args)
    except user_errors() as e:
        print(f"pdsim {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pdsim {args.command}: interrupted; results measured so far were kept", file=sys.stderr)
        return 130


def _module_of(command: str) -> str:
    return command if command in COMMANDS else f"{command}_cmd"


if __name__ == "__main__":
    sys.exit(main())
