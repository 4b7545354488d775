"""A plugin module that imports a package that is not installed."""

import mizuoto_not_installed_anywhere  # noqa: F401
