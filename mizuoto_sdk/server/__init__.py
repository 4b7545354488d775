"""The host server: ``mizuoto serve`` hosts one RuntimeService behind an HTTP API and a web page.

``record`` (``server.json``, through which commands find the running server) and ``client`` (how
they ask it) use the standard library only; the app itself (``app``, ``serve``) needs the
``server`` extra (FastAPI and uvicorn) and is imported only by ``mizuoto serve``.
"""
