"""`pdsim`: one entry point; each subcommand is a module with `add_parser(sub)` and `run(args)`.

Every command lives in `sim/commands/` and calls library functions; no library module imports
the CLI. The commands that run MLX (they import `calibrate` inside `run`, so `sim` itself never
imports MLX) set `NEEDS_MLX = True`, which switches to an optimized BLAS before MLX is imported.

Errors a user can cause (`sim.core.errors.UserError`: bad input, missing files, mismatched profiles)
print one line and exit 2; anything else is a bug and shows its traceback. Ctrl-C exits 130
after whatever was measured has been saved, at any moment: also while the parser and the
command's modules are still being imported (this module imports nothing heavy at its top, so
the window before `main` is entered is as short as Python's own start-up).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from sim.core.errors import UserError

COMMANDS = {
    "simulate": "sim.commands.simulate",
    "policies": "sim.commands.policies_cmd",
    "traces": "sim.commands.traces_cmd",
    "calibrate": "sim.commands.calibrate_cmd",
    "confirm": "sim.commands.confirm",
    "sweep": "sim.commands.sweep",
    "capacity": "sim.commands.capacity",
    "report": "sim.commands.report",
    "tune": "sim.commands.tune",
    "metrics": "sim.commands.metrics_cmd",
}


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and still exit code 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """pdsim's parser; with `command`, that command's only (the others' modules are not imported:
    `sweep` and `capacity` import pandas: 0.15 s of a 3 s `simulate` of the Azure 2023 conversation trace)."""
    p = Parser(prog="pdsim", description="Choose a prefill chunk budget and scheduling "
                                "policy: calibrate MLX kernels, simulate traces, confirm on the real engine.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        if command in (None, name):
            importlib.import_module(module).add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = "pdsim"
    try:
        parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
        args = parser.parse_args(argv)
        command = f"pdsim {args.command}"
        module = importlib.import_module(COMMANDS[args.command])
        if getattr(module, "NEEDS_MLX", False):
            from calibrate.host.blas import ensure_fast_blas
            ensure_fast_blas(argv)
        return module.run(args)
    except KeyboardInterrupt:
        print(f"{command}: interrupted; results measured so far were kept", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except UserError as e:
        print(f"{command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
