"""Writes a release archive of this checkout for http_archive: the tracked files (their
working-tree content) under `recurrent_lowering/`, byte-for-byte the same for the same files.

  python3 bazel/release_archive.py OUT.tar.gz     prints the archive's sha256

A consumer names it in http_archive(urls, sha256, strip_prefix = "recurrent_lowering").
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pathlib
import subprocess
import sys
import tarfile

PREFIX = "recurrent_lowering"


def tracked(root: pathlib.Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sorted(name for name in out.splitlines() if (root / name).is_file())


def write(root: pathlib.Path, out: pathlib.Path) -> str:
    """The archive of `root` at `out`; returns its sha256. Fixed owners, modes and times."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in tracked(root):
            path = root / name
            info = tarfile.TarInfo(f"{PREFIX}/{name}")
            info.size = path.stat().st_size
            info.mode = 0o755 if path.stat().st_mode & 0o100 else 0o644
            info.mtime = 0
            with open(path, "rb") as f:
                tar.addfile(info, f)
    data = gzip.compress(buffer.getvalue(), mtime=0)
    out.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


if __name__ == "__main__":
    print(write(pathlib.Path(__file__).resolve().parent.parent, pathlib.Path(sys.argv[1])))
