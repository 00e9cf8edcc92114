"""Errors a user can cause, reported as one line instead of a traceback wall."""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

#: Exit code for a mistake in the user's input (config, data, checkpoint).
USER_ERROR_EXIT = 2


class UserError(Exception):
    """A mistake the user can fix: the message names the value and the fix.

    Raised anywhere (config validation, data loading, checkpoint loading); `report_user_errors`
    turns it into one line on stderr and a non-zero exit, so expected errors never print a
    traceback.
    """


@contextlib.contextmanager
def report_user_errors(prefix: str = "syncopt") -> Iterator[None]:
    """Print a `UserError` as `prefix: error: ...` and exit with `USER_ERROR_EXIT`."""
    try:
        yield
    except UserError as err:
        print(f"{prefix}: error: {err}", file=sys.stderr, flush=True)
        sys.exit(USER_ERROR_EXIT)
