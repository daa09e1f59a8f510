"""The one error type the CLI turns into a one-line reason and a non-zero exit code."""


class LoweringError(Exception):
    """A user-facing failure: bad model file, unknown target, an op the target cannot run."""


def first_line(e: BaseException) -> str:
    """An exception's message cut to its first line (its type's name when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
