"""Engine classes checked against their manifests when ``get_engine`` imports them.

``plugin.MANIFESTS`` maps each engine id to its implementation and what its manifest declares:
some classes disagree with their manifest, one is no Engine, one cannot be subclassed, one module
raises when imported, one name is missing, one class declares nothing (the manifest's values fill
it in), and one class serves two manifests.
"""
