"""A loopback HTTP server for ``FILES``, with Range requests, that can misbehave per file.

``cut``: the next request for that path stops half way (the connection closes); ``wrong``: the
right number of bytes, not the right ones. ``requests`` lists ``(path, Range header)`` seen.
"""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mizuoto_fixture_models import FILES


class FileServer:
    def __init__(self):
        self.cut, self.wrong, self.requests = set(), set(), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.lstrip("/")
                server.requests.append((path, self.headers.get("Range")))
                data = FILES.get(path)
                if data is None:
                    self.send_error(404)
                    return
                if path in server.wrong:
                    data = bytes(len(data))
                start = 0
                if (wanted := self.headers.get("Range", "")).startswith("bytes="):
                    start = int(wanted[6:].split("-")[0])
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if path in server.cut:
                    server.cut.discard(path)
                    self.wfile.write(data[start : (start + len(data)) // 2])
                    self.close_connection = True
                    return
                self.wfile.write(data[start:])

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)
