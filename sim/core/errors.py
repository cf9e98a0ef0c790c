"""Errors a user can cause; the CLI prints them in one line and exits 2.

Every layer's user errors derive from `UserError` (a bad policy option, a profile from another
model, a malformed trace row, an existing report), so the CLI catches one class. Only these: a bug (a plain ValueError, KeyError, an engine invariant broken) must reach the user
as a traceback, so it is reported and fixed instead of being read as bad input.
"""
from __future__ import annotations


class UserError(Exception):
    """Bad input or a refused action (an existing report, a mismatched profile), said in one line."""


class InputError(UserError, ValueError):
    """Bad input that is also a ValueError, for library callers that catch those."""

