"""A remote A2A agent built on the official Python SDK's server (a2a-sdk), for troupe's A2A
client and its `a2a` agent provider (tests/suite/a2a_agents/).

Usage: remote_agent.py [--no-streaming] [--token TOKEN] [--port N]

It listens on 127.0.0.1 (on port N, else a free one), prints `PORT <n>` on stdout, and serves its card at
/.well-known/agent-card.json and JSON-RPC at /a2a (1.0, and 0.3 without an A2A-Version
header). With --token, JSON-RPC calls need `Authorization: Bearer TOKEN` (401 otherwise).

What it does depends on the first word of the user's text:
- `echo <text>`: a task whose answer artifact streams `You said: <text>` word by word
  (append chunks), then COMPLETED;
- `count`: answers how many messages this context has received so far, itself included;
- `ask <question>`: a task that goes INPUT_REQUIRED with the question as its status message;
  the client's reply in the task completes it with the answer `answer: <reply>`;
- `slow`: a task that says `tick <n>` in a WORKING status every 100 ms for 60 s; canceling it
  ends it CANCELED;
- `fail`: a task that ends FAILED with the status message `it broke`;
- `giveup`: a task the agent itself ends CANCELED (`gave up`);
- `auth`: a task that goes AUTH_REQUIRED;
- `nag`: a task that asks `again?` (INPUT_REQUIRED) after every reply, forever;
- `message <text>`: a plain Message reply (no task): `message: <text>`.
"""

import argparse
import asyncio
import socket
import sys
import uuid
from collections import defaultdict

import uvicorn
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse

from a2a.helpers.proto_helpers import get_message_text, new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    TaskState,
)

# Messages received, by context.
SEEN = defaultdict(int)


def agent_message(context_id, task_id, text):
    return Message(
        message_id=str(uuid.uuid4()),
        context_id=context_id,
        task_id=task_id or "",
        role=Role.ROLE_AGENT,
        parts=[Part(text=text)],
    )


class RemoteAgent(AgentExecutor):
    async def execute(self, context, event_queue):
        message = context.message
        text = get_message_text(message).strip()
        SEEN[context.context_id] += 1
        task = context.current_task
        if task is not None and task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            # The reply to a question this agent asked.
            updater = TaskUpdater(event_queue, task.id, task.context_id)
            first = get_message_text(task.history[0]).strip() if task.history else ""
            if first == "nag":
                await updater.requires_input(agent_message(task.context_id, task.id, "again?"))
                return
            await updater.start_work()
            await updater.add_artifact([Part(text=f"answer: {text}")], name="answer")
            await updater.complete()
            return
        word, _, rest = text.partition(" ")
        if word == "message":
            await event_queue.enqueue_event(
                agent_message(context.context_id, None, f"message: {rest}")
            )
            return
        task = new_task_from_user_message(message)
        task.id = context.task_id
        task.context_id = context.context_id
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        if word == "echo":
            words = f"You said: {rest}".split(" ")
            artifact_id = f"{task.id}-answer"
            for i, w in enumerate(words):
                await asyncio.sleep(0.02)
                await updater.add_artifact(
                    [Part(text=w if i == 0 else " " + w)],
                    artifact_id=artifact_id,
                    name="answer",
                    append=i > 0,
                    last_chunk=i == len(words) - 1,
                )
            await updater.complete()
        elif word == "count":
            n = SEEN[context.context_id]
            await updater.add_artifact([Part(text=f"messages in this context: {n}")])
            await updater.complete()
        elif word == "ask":
            await updater.requires_input(agent_message(task.context_id, task.id, rest))
        elif word == "slow":
            for i in range(600):
                await updater.update_status(
                    TaskState.TASK_STATE_WORKING,
                    agent_message(task.context_id, task.id, f"tick {i}"),
                )
                await asyncio.sleep(0.1)
            await updater.complete()
        elif word == "fail":
            await updater.failed(agent_message(task.context_id, task.id, "it broke"))
        elif word == "giveup":
            await updater.cancel(agent_message(task.context_id, task.id, "gave up"))
        elif word == "auth":
            await updater.requires_auth(agent_message(task.context_id, task.id, "log in first"))
        elif word == "nag":
            await updater.requires_input(agent_message(task.context_id, task.id, "again?"))
        else:
            await updater.reject(
                agent_message(task.context_id, task.id, f"unknown command {word!r}")
            )

    async def cancel(self, context, event_queue):
        task = context.current_task
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.cancel(agent_message(task.context_id, task.id, "canceled"))


class BearerAuth(BaseHTTPMiddleware):
    def __init__(self, app, token):
        super().__init__(app)
        self.token = token

    async def dispatch(self, request, call_next):
        if request.url.path == "/a2a" and request.headers.get("authorization") != f"Bearer {self.token}":
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return await call_next(request)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-streaming", action="store_true")
    parser.add_argument("--token")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    # Listening before the port is printed: a client that connects at once waits in the
    # backlog until uvicorn accepts, instead of being refused.
    sock.listen(128)
    port = sock.getsockname()[1]
    card = AgentCard(
        name="remote-test-agent",
        description="echoes, counts, asks, waits and fails on request",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=f"http://127.0.0.1:{port}/a2a",
                protocol_binding="JSONRPC",
                protocol_version="1.0",
            )
        ],
        capabilities=AgentCapabilities(streaming=not args.no_streaming),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="echoes", tags=["test"])],
    )
    handler = DefaultRequestHandler(
        agent_executor=RemoteAgent(), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(
        handler, "/a2a", enable_v0_3_compat=True
    )
    app = Starlette(routes=routes)
    if args.token:
        app.add_middleware(BearerAuth, token=args.token)
    print(f"PORT {port}", flush=True)
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
