"""llamaforge's own version (the installed distribution's), for manifests, caches and ``--version``. It lives
below every stage so that none of them imports the package root, which loads the notebook front."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("llamaforge")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+source"
