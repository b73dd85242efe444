"""Errors a user can cause. The CLI prints them as one line and exits non-zero."""


class ArxtuneError(Exception):
    """A problem the user can fix; the message says what and how."""


class FormatError(ArxtuneError):
    """A results or thresholds file that is corrupt or of an unknown version.

    Always one line, whatever the file put in it (a key holding a newline), so the runtime's warning is one line too."""

    def __init__(self, message: str = "") -> None:
        super().__init__(" ".join(str(message).split()))
