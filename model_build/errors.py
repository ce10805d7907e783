"""The one exception type for failures a user can act on, and the exit codes the command line maps them to.

Anything else that escapes is a bug in this tool and keeps its traceback.
"""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    # The bytes are not what the pin promises (size or sha256): the source changed or the pin is wrong.
    VERIFICATION_FAILED = 1
    # A command-line argument or the pins file is invalid; nothing was downloaded.
    BAD_INPUT = 2
    # The archive already exists locally or in S3; outputs are never overwritten.
    OUTPUT_EXISTS = 3
    # The network or S3 failed (HTTP error, dropped connection, access denied); rerunning may succeed and
    # resumes an interrupted download.
    TRANSFER_FAILED = 4


class BuildError(Exception):
    """A failure explained by its message alone: the command line prints it without a traceback."""

    def __init__(self, message: str, exit_code: ExitCode):
        super().__init__(message)
        self.exit_code = exit_code
