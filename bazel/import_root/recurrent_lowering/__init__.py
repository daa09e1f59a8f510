"""Makes this repository importable as `recurrent_lowering` whatever name a workspace gives it.

The code imports itself as `recurrent_lowering.<package>`, while Bazel lays a repository out
under the name the workspace chose (`rl/passes/...` for `http_archive(name = "rl")`). This
package, put on sys.path by the py_library beside it, points its `__path__` at the repository
root as the runfiles (or an action's inputs) lay it out: symlinks are not resolved, so only
declared files are importable.
"""

import os

_root = os.path.abspath(__file__)
for _ in range(4):  # __init__.py, recurrent_lowering/, import_root/, bazel/
    _root = os.path.dirname(_root)
__path__ = [_root]
