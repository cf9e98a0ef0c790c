"""Errors a user can cause; the CLI prints them in one line and exits 2."""
from __future__ import annotations


class UserError(Exception):
    """Bad input or a refused action (an existing report, a mismatched profile), said in one line."""


def user_errors() -> tuple[type[BaseException], ...]:
    from policies import PolicyError
    from sim.costmodel import ProfileError
    from sim.files import ExistsError
    from sim.state import EngineError
    from traces.trace import TraceError
    return (UserError, PolicyError, ProfileError, ExistsError, TraceError, EngineError, FileNotFoundError,
            ValueError)
