#!/usr/bin/env python3
"""A small OpenAI Responses server, written the way many small model servers are.

`http.server.ThreadingHTTPServer`, HTTP/1.1 keep-alive, the reply streamed as SSE in a
chunked body: each event is written and flushed on its own, so each is one small send on
the socket. Every request gets the same short reply (a few text deltas) whatever it asks.

    python3 responses_server.py [--nodelay]

`--nodelay` sets TCP_NODELAY on each accepted connection; without it the socket keeps
Nagle's algorithm, as Python's default does. Prints `listening on <port>` (port chosen by the
system, on 127.0.0.1) once ready; stops when its stdin closes. `GET /last-request` answers
the body of the last POST, for a client that wants to send exactly what another sent, and
`GET /last-request-head` its request line and headers (a JSON list, in the order they came),
to check that it did.
A POST to a path ending in `/chat/completions` gets the same reply as Chat Completions
chunks (`data:` lines, then `data: [DONE]`).

Standard library only.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DELTAS = ["Hello", ", ", "world", "."]


def events(n):
    """The SSE events of reply number `n`, as (type, payload) pairs."""
    rid = "resp_%d" % n
    mid = "msg_%d" % n
    text = "".join(DELTAS)

    def response(status, output):
        r = {"id": rid, "object": "response", "status": status, "model": "bench-model",
             "output": output}
        if status == "completed":
            r["usage"] = {"input_tokens": 10, "output_tokens": len(DELTAS),
                          "total_tokens": 10 + len(DELTAS)}
        return r

    part = {"type": "output_text", "text": text, "annotations": []}
    item = {"id": mid, "type": "message", "status": "completed", "role": "assistant",
            "content": [part]}
    yield "response.created", {"response": response("in_progress", [])}
    yield "response.output_item.added", {"output_index": 0, "item": {
        "id": mid, "type": "message", "status": "in_progress", "role": "assistant",
        "content": []}}
    yield "response.content_part.added", {"item_id": mid, "output_index": 0,
                                          "content_index": 0,
                                          "part": dict(part, text="")}
    for d in DELTAS:
        yield "response.output_text.delta", {"item_id": mid, "output_index": 0,
                                             "content_index": 0, "delta": d}
    yield "response.output_text.done", {"item_id": mid, "output_index": 0,
                                        "content_index": 0, "text": text}
    yield "response.content_part.done", {"item_id": mid, "output_index": 0,
                                         "content_index": 0, "part": part}
    yield "response.output_item.done", {"output_index": 0, "item": item}
    yield "response.completed", {"response": response("completed", [item])}


def chat_chunks(n):
    """The SSE `data:` payloads of reply number `n` over Chat Completions."""
    cid = "chatcmpl_%d" % n

    def chunk(delta, finish=None):
        return {"id": cid, "object": "chat.completion.chunk", "model": "bench-model",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    for d in DELTAS:
        yield chunk({"content": d})
    yield chunk({}, "stop")
    yield {"id": cid, "object": "chat.completion.chunk", "model": "bench-model",
           "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": len(DELTAS),
                                    "total_tokens": 10 + len(DELTAS)}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = False
    counter = 0
    last_request = b"{}"
    last_head = b"[]"
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_GET(self):
        """`GET /last-request`: the body of the last POST, as it came; `GET
        /last-request-head`: its request line and headers."""
        if self.path not in ("/last-request", "/last-request-head"):
            self.send_error(404)
            return
        with Handler.lock:
            if self.path == "/last-request":
                body = Handler.last_request
            else:
                body = Handler.last_head
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        try:
            self.reply()
        except (BrokenPipeError, ConnectionResetError):
            # The client went away mid-reply; it is its right.
            self.close_connection = True

    def reply(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        try:
            json.loads(body or b"{}")
        except ValueError:
            self.send_error(400, "bad JSON")
            return
        head = [self.requestline] + ["%s: %s" % kv for kv in self.headers.items()]
        with Handler.lock:
            Handler.counter += 1
            Handler.last_request = body
            Handler.last_head = json.dumps(head).encode()
            n = Handler.counter
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        if self.path.rstrip("/").endswith("/chat/completions"):
            frames = ["data: %s\n\n" % json.dumps(c) for c in chat_chunks(n)]
            frames.append("data: [DONE]\n\n")
        else:
            frames = []
            for seq, (kind, payload) in enumerate(events(n)):
                payload = dict(payload, type=kind, sequence_number=seq)
                frames.append("event: %s\ndata: %s\n\n" % (kind, json.dumps(payload)))
        for frame in frames:
            frame = frame.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main():
    Handler.disable_nagle_algorithm = "--nodelay" in sys.argv[1:]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("listening on %d" % server.server_address[1], flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
