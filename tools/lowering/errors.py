"""The one error type the CLI turns into a one-line reason and a non-zero exit code."""


class LoweringError(Exception):
    """A user-facing failure: bad model file, unknown target, an op the target cannot run."""
