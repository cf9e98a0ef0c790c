"""Arrival traces: what requests arrive when, how long their prompts are, how much they generate."""
from traces.trace import Request, Trace, TraceError

__all__ = ["Request", "Trace", "TraceError"]
