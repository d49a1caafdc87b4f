"""octet: low-precision numerics for training large models.

The C++/CUDA library is header-only (include/octet); this package embeds it in PyTorch:
``import octet.torch`` registers the ``torch.ops.octet`` ops and gives the Python API.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("octet")
except PackageNotFoundError:  # running from the source tree
    __version__ = "source"
