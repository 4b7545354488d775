"""An agent process for the remote client tests: two agents over one service that finds the
``faulty`` fixture engine and the bundled ones, on 127.0.0.1 at free ports.

argv: the token file and the file cache's folder. Prints ``<port> <silent port>`` once both
listen: the first agent sends a heartbeat every 0.2 s, the second none (an hour apart). It stops
when its stdin closes (the test's end) or is killed.
"""

from __future__ import annotations

import faulthandler
import sys
import threading
from pathlib import Path

faulthandler.dump_traceback_later(300, exit=True)  # a bound, should the test never stop it
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent / "serving_site")]

from serving_support import SITE  # noqa: E402

from mizuoto_sdk.discovery import Discovery  # noqa: E402
from mizuoto_sdk.host import RuntimeService  # noqa: E402
from mizuoto_sdk.host.agent import Agent  # noqa: E402


def main() -> None:
    token = Path(sys.argv[1]).read_bytes().strip()
    files = Path(sys.argv[2])
    discovery = Discovery(path=[str(SITE), *sys.path], selection=None)
    with RuntimeService(None, discovery) as service:
        agents = [
            Agent(service, token, heartbeat_interval=interval, files=files, devices=["cpu"])
            for interval in (0.2, 3600.0)
        ]
        for agent in agents:
            agent.serve("127.0.0.1", 0)
            threading.Thread(target=agent.serve_forever, args=(0.05,), daemon=True).start()
        print(*(agent.bound_address[1] for agent in agents), flush=True)
        sys.stdin.read()
        for agent in agents:
            agent.shutdown()


if __name__ == "__main__":
    main()
