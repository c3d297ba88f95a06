"""LBCC's errors as Python exceptions.

Every failure of an LBCC call is an absl::Status in C++ and arrives here as an instance of
`Error` (or of a subclass per status code) carrying the code name and the full message:

    try:
        comm.sparse_all_reduce(deltas, outs, codec, states)
    except lbcc.UnavailableError as e:     # a peer or link was lost: recreate the communicator
        print(e.code, e.message)           # "UNAVAILABLE", "... rank 3 ..."

Subclasses also derive from the closest built-in exception (InvalidArgumentError is a
ValueError, DeadlineExceededError a TimeoutError, ...), so generic handlers work too. Wrong
kinds of Python arguments (not a tensor, a float64 tensor, a non-contiguous one) raise plain
TypeError / ValueError before anything reaches C++.
"""


class Error(Exception):
    """An LBCC status: `code` is the status code name (e.g. "DATA_LOSS"), `message` its text."""

    code = "UNKNOWN"

    def __init__(self, code, message):
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self):
        return f"{self.code}: {self.message}"


class InvalidArgumentError(Error, ValueError):
    """Caller input was wrong (found before anything was sent)."""


class FailedPreconditionError(Error, RuntimeError):
    """Wrong state: e.g. the communicator failed earlier, a payload of another basis."""


class UnavailableError(Error, ConnectionError):
    """A peer or link was lost: recreate the communicator."""


class DeadlineExceededError(Error, TimeoutError):
    """A peer did not answer in time (LBCC_TIMEOUT_S or the operation's timeout)."""


class DataLossError(Error):
    """Corrupt or foreign bytes."""


class UnimplementedError(Error, NotImplementedError):
    """No such codec or algorithm for this input: fall back."""


class CancelledError(Error):
    """Closed or aborted while pending."""


class InternalError(Error, RuntimeError):
    """An LBCC bug."""


class AbortedError(Error, RuntimeError):
    """The operation was aborted and may be retried (e.g. membership changed)."""


class ArgumentTypeError(Error, TypeError):
    """A Python argument of a kind the binding cannot convert (e.g. a list of ints where
    codec states are expected)."""


class NotFoundError(Error):
    """A file or entity does not exist."""


class PermissionDeniedError(Error):
    """The caller may not do this (e.g. a file it cannot read)."""


_BY_CODE = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    "FAILED_PRECONDITION": FailedPreconditionError,
    "UNAVAILABLE": UnavailableError,
    "DEADLINE_EXCEEDED": DeadlineExceededError,
    "DATA_LOSS": DataLossError,
    "UNIMPLEMENTED": UnimplementedError,
    "CANCELLED": CancelledError,
    "INTERNAL": InternalError,
    "ABORTED": AbortedError,
    "NOT_FOUND": NotFoundError,
    "PERMISSION_DENIED": PermissionDeniedError,
}


def error_class(code):
    """The exception class of a status code name (Error for codes without their own class)."""
    return _BY_CODE.get(code, Error)


def make_error(code, message):
    """An exception for `code` (a status code name) and `message`, as LBCC's C++ raises them."""
    return error_class(code)(code, message)
