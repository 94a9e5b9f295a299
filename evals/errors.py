"""The one error type of a bad evaluation input, so that the
command reports every kind the same way."""


class EvalInputError(ValueError):
    """A bad input (data file, folder, device): the message
    is one line naming the option, the value and the fix."""
