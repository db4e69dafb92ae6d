"""``torch-spdl migrate``: move torch ``DataLoader`` code onto torch_spdl.

Rewrites torch's ``DataLoader`` to ``torch_spdl.DataLoader`` (flagging the arguments whose
meaning differs) and splits map-style ``Dataset`` classes into a ``load`` (I/O) and a
``process`` (CPU) stage where that is safe, explaining every decision. Built on libcst, so
everything outside the edits (comments, formatting) is kept byte for byte.
"""

from ._driver import iter_python_files, migrate_file, migrate_paths, migrate_source
from ._report import Decision, FileResult, render_json, render_text

__all__ = [
    "Decision",
    "FileResult",
    "iter_python_files",
    "migrate_file",
    "migrate_paths",
    "migrate_source",
    "render_json",
    "render_text",
]
