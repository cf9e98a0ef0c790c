"""Errors a user can cause; the CLI prints them in one line and exits 2.

Only these: a bug (a plain ValueError, KeyError, an engine invariant broken) must reach the user
as a traceback, so it is reported and fixed instead of being read as bad input.
"""
from __future__ import annotations


class UserError(Exception):
    """Bad input or a refused action (an existing report, a mismatched profile), said in one line."""


class InputError(UserError, ValueError):
    """Bad input that is also a ValueError, for library callers that catch those."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The input errors of every layer (imported here, late, so `sim` stays free of import cycles)."""
    from policies import PolicyError
    from sim.cost.model import ProfileError
    from sim.core.files import ExistsError
    from traces.trace import TraceError
    return (UserError, PolicyError, ProfileError, ExistsError, TraceError)
