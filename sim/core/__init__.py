"""Plumbing every layer shares: the one user-error class (`errors`), reading input files with a
one-line error for every way they fail (`inputs`), writing results atomically without ever
overwriting silently (`files`, `outdir`), and plain-text tables (`table`). Imports nothing else
of pdsim."""
