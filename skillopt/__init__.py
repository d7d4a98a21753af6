"""skillopt: train an agent's skill document the way one trains a network.

The domain library is pure and typed and never imports Prefect; Prefect lives in the
top-level ``tasks`` and ``flows`` packages, which call into this one.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("skillopt")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
