"""The one error type the command line turns into a clear line and exit code 2."""


class UsageError(ValueError):
    """Bad input from the user: an unknown name, a knob out of range, a malformed spec.

    The message is one line that names the bad value and what is allowed.
    """


def one_of(what: str, value: object, allowed) -> UsageError:
    allowed = sorted(allowed)
    return UsageError(f"unknown {what} {value!r}; allowed: {', '.join(map(str, allowed))}")
