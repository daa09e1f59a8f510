"""Runs pytest on the files Bazel passes as arguments, deterministically and without caches.

Hypothesis (when installed) is derandomized and keeps no example database, so a Bazel
test's result depends only on its inputs.
"""

import sys

import pytest


class _Deterministic:
    @staticmethod
    def pytest_configure(config):
        try:
            from hypothesis import settings
        except ImportError:  # a consumer's environment may not have hypothesis
            return
        settings.register_profile("bazel", database=None, derandomize=True, deadline=None)
        settings.load_profile("bazel")


if __name__ == "__main__":
    sys.exit(
        pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[_Deterministic()])
    )
