"""Runs app.py on this machine, as a function URL would call it.

    RUNLEASE_ENDPOINT_SECRET=$(runlease queues endpoint-secret reports) python3 local.py 8787
    runlease queues set-endpoint reports http://127.0.0.1:8787/
    (the coordinator started with RUNLEASE_ENDPOINT_ALLOW_HOSTS=127.0.0.1)

Each request becomes a function URL event (payload format 2.0) for
app.handler; a long job's hand-off runs `report` on a thread of this process
instead of an asynchronous invocation. It prints one line per request.
"""

import base64
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import app


def hand_off_here(push, context):
    threading.Thread(target=app.report, args=(push,), daemon=True).start()


app.hand_off = hand_off_here


class FunctionUrl(BaseHTTPRequestHandler):
    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        event = {
            "version": "2.0",
            "rawPath": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "requestContext": {"http": {"method": "POST", "path": self.path}},
            "body": base64.b64encode(raw).decode(),
            "isBase64Encoded": True,
        }
        result = app.handler(event, None)
        body = (result.get("body") or "").encode()
        self.send_response(result["statusCode"])
        for name, value in result.get("headers", {}).items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        print(json.dumps({"webhook_id": event["headers"].get("webhook-id"), "status": result["statusCode"]}), flush=True)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 8787), FunctionUrl)
    print(json.dumps({"listening": server.server_address[1]}), flush=True)
    server.serve_forever()
