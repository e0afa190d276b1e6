"""Errors that end a command with a one-line message and exit code 2 (never a traceback)."""


class DpcompareError(Exception):
    """A user-facing error: the message says what is wrong and what to do."""

    exit_code = 2
    #: True when only this process meets the error (its peers may not): every rank prints it then.
    local = False


class LaunchError(DpcompareError):
    """The launch environment is inconsistent (half a set of rank variables, bad values...)."""


class ConfigError(DpcompareError):
    """A flag or a combination of flags cannot work."""


class CheckpointError(DpcompareError):
    """A checkpoint cannot be read or does not fit this run."""


#: exit code of a run stopped because its loss or gradients stopped being finite
DIVERGED_EXIT = 3


class DivergedError(DpcompareError):
    """Training diverged (a non-finite loss or gradient); every rank raises it at the same step."""

    exit_code = DIVERGED_EXIT
