"""User errors. The CLI catches `TwostepError` once and prints its message; anything else is a bug."""


class TwostepError(Exception):
    """An error the user can fix: the message says what was got, what was expected, and the fix."""


class BadCheckpoint(TwostepError):
    """A checkpoint directory, state dict or config that cannot be loaded."""


class BadArtifact(TwostepError):
    """An artifact directory that is missing files, fails its hashes or has a wrong manifest."""


class BadInput(TwostepError):
    """Input text or token ids that the model cannot take."""


class TooLarge(BadInput):
    """A request that is well formed but more work than a server takes at once (HTTP 413): send it in parts."""


class BackendUnavailable(TwostepError):
    """A backend that is unknown, or whose libraries or hardware are missing here."""


class ParityFailure(TwostepError):
    """Exported graphs or a backend that do not match eager PyTorch."""


class OutputError(TwostepError):
    """An output path that cannot be written, or that holds something twostep must not replace."""


class SessionBusy(TwostepError):
    """A step session that is already decoding in another thread: a session decodes one batch at a time."""


class Overloaded(TwostepError):
    """A batching translator (or the server over it) whose queue is full or that is shutting down: retry later."""
