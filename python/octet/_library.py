"""Finds and loads octet's op libraries (one shared library per op family)."""

import os

_loaded = set()


def library_dirs():
    """Where the libraries are looked for: $OCTET_LIBRARY_DIR (a build tree), then the package."""
    dirs = []
    if os.environ.get("OCTET_LIBRARY_DIR"):
        dirs.append(os.environ["OCTET_LIBRARY_DIR"])
    dirs.append(os.path.dirname(os.path.abspath(__file__)))
    return dirs


def load(family):
    """Loads ``_<family>.so`` into torch (its ops appear under torch.ops.octet)."""
    if family in _loaded:
        return
    import torch

    name = "_" + family + ".so"
    for d in library_dirs():
        path = os.path.join(d, name)
        if os.path.exists(path):
            torch.ops.load_library(path)
            _loaded.add(family)
            return
    raise ImportError(
        f"octet: the op library {name} was not found in {library_dirs()}; install the package "
        "(pip install .) or point OCTET_LIBRARY_DIR at a build tree's python/lib"
    )
