"""All-or-nothing output files: nothing appears at the destination unless lowering succeeded.

Files are written into a hidden staging directory next to the destination (same file
system, so the final move is an atomic rename) and moved into place only on success.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile


class Staging:
    def __init__(self, directory: pathlib.Path):
        self.directory = directory
        self._moves: list[tuple[pathlib.Path, pathlib.Path]] = []

    def path_for(self, destination: os.PathLike | str) -> pathlib.Path:
        """A path to write now; it is moved to `destination` when the staging commits."""
        destination = pathlib.Path(destination)
        staged = self.directory / f"{len(self._moves)}_{destination.name}"
        self._moves.append((staged, destination))
        return staged

    def _commit(self) -> None:
        for staged, destination in self._moves:
            if not staged.exists():
                continue
            destination.parent.mkdir(parents=True, exist_ok=True)
            if destination.is_dir():  # never replace a directory (lower.run refuses these)
                raise IsADirectoryError(f"{destination}: is a directory")
            os.replace(staged, destination)


@contextlib.contextmanager
def staged_outputs(anchor: os.PathLike | str):
    """Yields a Staging whose files land beside `anchor` only if the block succeeds."""
    parent = pathlib.Path(anchor).resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".lowering-", dir=parent))
    try:
        staging = Staging(tmp)
        yield staging
        staging._commit()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
