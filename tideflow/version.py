"""The package's version: pyproject.toml's, read from the installed package's metadata.

The lowest layer, so that the settings registry (the default image tag) and the
package itself (``tideflow.__version__``) read the one version the build stamps.
"""

from importlib.metadata import version

__version__ = version("tideflow")
