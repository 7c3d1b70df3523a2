#!/usr/bin/env python3
"""A small stdio gateway for troupe's tests, speaking the module line protocol.

At start it writes its pid to $GATEWAY_PID, a line to stderr, the lines of $GATEWAY_RAW (a
JSON array of strings) as they are, and feeds the texts of $GATEWAY_FEED (a JSON
array) as messages with ids `m-<pid>-<n>` in conversation $GATEWAY_CONVERSATION (default
`chan-1`). Every frame troupe writes is appended to $GATEWAY_LOG (one JSON object a line,
with this process's pid). A reply, dispatch or ping is acknowledged unless $GATEWAY_ACK is
`no` (a reply after $GATEWAY_ACK_DELAY seconds, default 0); a dispatch's result echoes its
payload. With $GATEWAY_FEED_GATE set, the n-th text (from the second on) waits until the
file `$GATEWAY_FEED_GATE.<n>` exists (fed from a thread of its own meanwhile). It ends when its
stdin ends.
"""
import json
import os
import sys
import threading
import time

pid = os.getpid()
log_path = os.environ.get("GATEWAY_LOG")
ack = os.environ.get("GATEWAY_ACK", "yes") == "yes"
conversation = os.environ.get("GATEWAY_CONVERSATION", "chan-1")
ack_delay = float(os.environ.get("GATEWAY_ACK_DELAY", "0"))


writing = threading.Lock()


def send(frame):
    with writing:
        sys.stdout.write(json.dumps(frame) + "\n")
        sys.stdout.flush()


def record(frame):
    if log_path:
        frame = dict(frame, pid=pid)
        with open(log_path, "a") as f:
            f.write(json.dumps(frame) + "\n")


if os.environ.get("GATEWAY_PID"):
    tmp = os.environ["GATEWAY_PID"] + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(pid))
    os.replace(tmp, os.environ["GATEWAY_PID"])

print(f"gateway {pid} started", file=sys.stderr, flush=True)

for raw in json.loads(os.environ.get("GATEWAY_RAW", "[]")):
    sys.stdout.write(raw + "\n")
    sys.stdout.flush()

gate = os.environ.get("GATEWAY_FEED_GATE")


def feed():
    for n, text in enumerate(json.loads(os.environ.get("GATEWAY_FEED", "[]"))):
        while gate and n > 0 and not os.path.exists(f"{gate}.{n}"):
            time.sleep(0.02)
        send({"type": "message", "id": f"m-{pid}-{n}", "conversation": conversation, "text": text})


if gate:
    threading.Thread(target=feed, daemon=True).start()
else:
    feed()

for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    frame = json.loads(line)
    record(frame)
    kind = frame.get("type")
    if kind == "reply" and ack:
        time.sleep(ack_delay)
        send({"type": "ack", "id": frame["id"]})
    elif kind == "ping" and ack:
        send({"type": "ack", "id": frame["id"]})
    elif kind == "dispatch" and ack:
        send({"type": "ack", "id": frame["id"], "result": {"echo": frame["payload"]}})
