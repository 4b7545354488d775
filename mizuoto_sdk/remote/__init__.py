"""Remote engines: protocol 2 between a host and a ``mizuoto agent`` on another machine.

``wire`` reads and writes frames over a socket, ``files`` moves files by content, ``client`` is
the host's connection to an agent and the replica object its handle routes to. This package sits
above ``mizuoto_sdk.serving`` (whose exchange and handle it reuses) and below the host.
"""
