#!/usr/bin/env python3
"""A small stdio gateway for troupe's tests, speaking the module line protocol.

At start it writes its pid to $GATEWAY_PID, a line to stderr, the lines of $GATEWAY_RAW (a
JSON array of strings) as they are, and feeds the texts of $GATEWAY_FEED (a JSON
array) as messages with ids `m-<pid>-<n>` in conversation $GATEWAY_CONVERSATION (default
`chan-1`). Every frame troupe writes is appended to $GATEWAY_LOG (one JSON object a line,
with this process's pid). A reply, dispatch or ping is acknowledged unless $GATEWAY_ACK is
`no` (a reply after $GATEWAY_ACK_DELAY seconds, default 0); a dispatch's result echoes its
payload. It ends when its stdin ends.
"""
import json
import os
import sys
import time

pid = os.getpid()
log_path = os.environ.get("GATEWAY_LOG")
ack = os.environ.get("GATEWAY_ACK", "yes") == "yes"
conversation = os.environ.get("GATEWAY_CONVERSATION", "chan-1")
ack_delay = float(os.environ.get("GATEWAY_ACK_DELAY", "0"))


def send(frame):
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

for n, text in enumerate(json.loads(os.environ.get("GATEWAY_FEED", "[]"))):
    send({"type": "message", "id": f"m-{pid}-{n}", "conversation": conversation, "text": text})

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
