"""The package's version: pyproject.toml's, read from the installed package's metadata.

The lowest layer, so that the settings registry (the default image tag) and the
package itself (``tideflow.__version__``) read the one version the build stamps.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tideflow")
except PackageNotFoundError:  # a source tree on sys.path, not installed: no build stamped it
    __version__ = "0+unknown"
