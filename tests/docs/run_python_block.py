"""Runs one Python example extracted from the docs (tests/docs/CMakeLists.txt) as a script.

Usage: python run_python_block.py BLOCK.py   (with PYTHONPATH=python and OCTET_LIBRARY_DIR=<build>/python/lib)

The block passes when it runs to the end (its own asserts check its results). It is reported
skipped (a line starting with "skipped:", CTest's SKIP_REGULAR_EXPRESSION) when what it imports
cannot be had here: torch for a block that imports octet.torch, jax for octet.jax, or the op
libraries of this build (configured with -DOCTET_BUILD_PYTHON=OFF, or torch/jax not found then).
"""

import importlib.util
import os
import runpy
import sys


def main():
    block = sys.argv[1]
    with open(block, encoding="utf-8") as f:
        source = f.read()
    needs = []  # (module, library file in OCTET_LIBRARY_DIR)
    if "octet.torch" in source:
        needs.append(("torch", "_quant.so"))
    if "octet.jax" in source:
        needs.append(("jax", "_jax_ffi.so"))
    lib_dir = os.environ.get("OCTET_LIBRARY_DIR", "")
    for module, library in needs:
        if importlib.util.find_spec(module) is None:
            print(f"skipped: {module} is not importable by {sys.executable} (./octet.sh setup installs it into .venv)")
            return 0
        if not os.path.exists(os.path.join(lib_dir, library)):
            print(f"skipped: {library} is not built in {lib_dir or '(OCTET_LIBRARY_DIR unset)'} "
                  "(configure with -DOCTET_BUILD_PYTHON=ON where torch and jax are importable)")
            return 0
    runpy.run_path(block, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
