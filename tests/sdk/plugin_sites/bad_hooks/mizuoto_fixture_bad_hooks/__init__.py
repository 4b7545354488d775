"""Plugin modules that import fine but whose ``mizuoto_engines`` hook is wrong, one way each.

The entry point is the module's name with dashes.
"""
