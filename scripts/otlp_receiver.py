#!/usr/bin/env python3
"""A minimal OTLP/HTTP receiver for troupe's trace tests and for looking at spans by hand.

Decodes protobuf `POST /v1/traces` bodies (gzip or not) with the OpenTelemetry protocol
definitions and prints one JSON line per span: name, trace_id, span_id, parent_span_id,
kind, status, attributes (OTLP's JSON mapping, e.g. {"stringValue": "x"}) and the
resource's attributes. The first line names the bound address:

    {"listening": "127.0.0.1:PORT"}

Usage: otlp_receiver.py [PORT]   (0 picks a free port; default 4318). Loopback only.
Needs the `opentelemetry-proto` package (scripts/install-python-peers puts it in .venv).
"""
import gzip
import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status


def attributes(key_values):
    return {kv["key"]: kv.get("value", {}) for kv in key_values}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            resource = attributes(MessageToDict(rs.resource).get("attributes", []))
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    d = MessageToDict(sp)
                    print(
                        json.dumps(
                            {
                                "path": self.path,
                                "name": sp.name,
                                "trace_id": sp.trace_id.hex(),
                                "span_id": sp.span_id.hex(),
                                "parent_span_id": sp.parent_span_id.hex(),
                                "kind": Span.SpanKind.Name(sp.kind),
                                "status": Status.StatusCode.Name(sp.status.code),
                                "attrs": attributes(d.get("attributes", [])),
                                "links": [
                                    {"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()}
                                    for l in sp.links
                                ],
                                "resource": resource,
                            }
                        ),
                        flush=True,
                    )
        out = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 4318
    server = HTTPServer(("127.0.0.1", port), Handler)
    host, bound = server.server_address[:2]
    print(json.dumps({"listening": f"{host}:{bound}"}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
