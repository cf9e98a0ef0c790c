"""One module per `pdsim` subcommand; each has `add_parser(subparsers)` and `run(args) -> int`."""
