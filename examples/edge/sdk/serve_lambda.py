"""Serves lambda_function.handler on this machine as a function URL calls it.

    RUNLEASE_ENDPOINT_SECRET=$(runlease queues endpoint-secret reports) python3 serve_lambda.py 8787
    runlease queues set-endpoint reports http://127.0.0.1:8787/
    (the coordinator started with RUNLEASE_ENDPOINT_ALLOW_HOSTS=127.0.0.1)

Each request becomes a function URL event (payload format 2.0). Prints
{"listening": PORT} once it serves.
"""

import base64
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lambda_function import handler


class FunctionUrl(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        result = handler({
            "version": "2.0",
            "rawPath": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "requestContext": {"http": {"method": "POST", "path": self.path}},
            "body": base64.b64encode(raw).decode(),
            "isBase64Encoded": True,
        })
        body = result["body"].encode()
        self.send_response(result["statusCode"])
        for name, value in result["headers"].items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 8787), FunctionUrl)
    print(json.dumps({"listening": server.server_address[1]}), flush=True)
    server.serve_forever()
