#!/usr/bin/env python3
"""Drives troupe's A2A endpoint with the official Python A2A SDK client.

Usage: client_e2e.py BASE_URL VERSION [TOKEN]
  BASE_URL  where `troupe serve` listens, e.g. http://127.0.0.1:8080
  VERSION   1.0 or 0.3: the card interface the client picks (0.3 uses the SDK's 0.3 transport)
  TOKEN     bearer token, when the server wants one

At the end it prints "RESTART" and reads one line from stdin: the base URL of the server
started again over the same data directory (killed with SIGKILL meanwhile). Then it checks that
the context goes on in the same conversation, that old tasks are found with their history and
artifacts, and that the task running at the crash ended FAILED and its webhook heard it.

The server's scripted model must answer, in this order (one model call per task):
  1. default (echoes "You said: hello")     send, blocking
  2. {"text": "Streamed answer", "chunk_chars": 4, "delay_ms": 300}   streamed
  3. {"hang": true}                         sent without waiting, then canceled
  4. {"text": "Slow answer", "delay_ms": 1500}      sent without waiting, then resubscribed
  5. default                                a raw 0.3 call with no A2A-Version header
  6. {"a2a": {"state": "input-required", "text": "Which city?"}}   answered after the restart
  7. {"hang": true}                         running when the server dies
  after the restart: default answers.

Prints one line per step and exits 0 when every check holds.
"""

import asyncio
import http.server
import json
import sys
import threading

import httpx

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_text_message
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}", flush=True)


def state_name(state):
    return TaskState.Name(state)


def request(text, context_id=None, return_immediately=False):
    msg = new_text_message(text, context_id=context_id, role=Role.ROLE_USER)
    req = SendMessageRequest(message=msg)
    req.configuration.return_immediately = return_immediately
    return req


def answer_text(task):
    return "".join(p.text for a in task.artifacts for p in a.parts)


def assemble(updates):
    """The artifact's text as a client builds it: `append` adds to it, otherwise replaces."""
    text = ""
    for u in updates:
        piece = "".join(p.text for p in u.artifact.parts)
        text = text + piece if u.append else piece
    return text


async def only_event(stream):
    events = [e async for e in stream]
    check(len(events) == 1, "a non-streaming send yields one event")
    return events[0]


async def wait_for_state(client, task_id, want, tries=100):
    for _ in range(tries):
        task = await client.get_task(GetTaskRequest(id=task_id))
        if task.status.state == want:
            return task
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} never reached {state_name(want)}")


V1_METHODS = {
    "SendMessage", "SendStreamingMessage", "GetTask", "ListTasks", "CancelTask", "SubscribeToTask",
    "CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig", "ListTaskPushNotificationConfigs",
}
V03_METHODS = {
    "message/send", "message/stream", "tasks/get", "tasks/cancel", "tasks/resubscribe",
    "tasks/pushNotificationConfig/set", "tasks/pushNotificationConfig/get",
    "tasks/pushNotificationConfig/list",
}


class Webhook:
    """A push notification receiver on loopback: keeps each POST's headers and JSON body."""

    def __init__(self):
        got = self.got = []
        done = self.done = threading.Event()
        failed = self.failed = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.end_headers()
                text = json.dumps(body)
                if "TASK_STATE_COMPLETED" in text or '"completed"' in text:
                    done.set()
                if "TASK_STATE_FAILED" in text or '"failed"' in text:
                    failed.set()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/hook" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


async def run(base, version, token):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    calls = []  # (JSON-RPC method, A2A-Version header) of every call the SDK makes

    async def record(req):
        if req.method == "POST":
            calls.append((json.loads(req.content)["method"], req.headers.get("a2a-version")))

    async with httpx.AsyncClient(headers=headers, timeout=30, event_hooks={"request": [record]}) as http:
        card = await A2ACardResolver(http, base).get_agent_card()
        check(card.capabilities.streaming, "the card declares streaming")
        versions = sorted(i.protocol_version for i in card.supported_interfaces)
        check(versions == ["0.3", "1.0"], f"the card offers 1.0 and 0.3 ({versions})")
        # The client picks 1.0 when offered; keep only the interface under test.
        keep = [i for i in card.supported_interfaces if i.protocol_version == version]
        del card.supported_interfaces[:]
        card.supported_interfaces.extend(keep)

        blocking = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)
        streaming = ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card)

        # 1. send (blocking): a completed task with the answer as an artifact.
        first = (await only_event(blocking.send_message(request("hello")))).task
        check(state_name(first.status.state) == "TASK_STATE_COMPLETED", "send completes the task")
        check(answer_text(first) == "You said: hello", f"send answers ({answer_text(first)!r})")
        context_id = first.context_id
        check(context_id != "", "the task has a context")

        # 2. stream, in the same context: task, working, artifact, completed, then the end.
        events = [e async for e in streaming.send_message(request("stream please", context_id))]
        kinds = [e.WhichOneof("payload") for e in events]
        check(kinds[0] == "task", f"a stream opens with the task ({kinds})")
        check(kinds[-1] == "status_update", "a stream ends with a status update")
        states = [state_name(e.status_update.status.state) for e in events if e.HasField("status_update")]
        check(states[0] == "TASK_STATE_WORKING", f"the stream shows work ({states})")
        check(states[-1] == "TASK_STATE_COMPLETED", "the stream ends completed")
        # The answer arrives as it is written: pieces appended to the artifact, then the whole
        # answer once more (append false, last chunk) at the end.
        updates = [e.artifact_update for e in events if e.HasField("artifact_update")]
        streamed = assemble(updates)
        check(len(updates) > 2, f"the answer streams in pieces ({len(updates)} updates)")
        check(any(u.append for u in updates), "later pieces append to the artifact")
        check(updates[-1].last_chunk and not updates[-1].append, "the last update is the whole answer")
        check(streamed == "Streamed answer", f"the stream carries the answer ({streamed!r})")
        streamed_id = events[0].task.id
        check(events[0].task.context_id == context_id, "the streamed task joined the context")

        # 3. get: the first task, with its history.
        got = await blocking.get_task(GetTaskRequest(id=first.id))
        check(got.id == first.id and state_name(got.status.state) == "TASK_STATE_COMPLETED", "get finds the task")
        check(got.history[0].parts[0].text == "hello", "get returns the history")
        try:
            await blocking.get_task(GetTaskRequest(id="no-such-task"))
            raise AssertionError("get of an unknown task succeeded")
        except TaskNotFoundError:
            check(True, "get of an unknown task is TaskNotFound")

        # 4. list (1.0 only; 0.3 has no ListTasks).
        if version == "1.0":
            page = await blocking.list_tasks(ListTasksRequest(context_id=context_id))
            ids = [t.id for t in page.tasks]
            check(ids == [streamed_id, first.id], f"list returns the context's tasks, newest first ({ids})")
            check(page.total_size == 2 and page.next_page_token == "", "list has one page of two")
            check(len(page.tasks[0].artifacts) == 0, "list leaves artifacts out unless asked")

        # 5. cancel a task that is running (its model call hangs until canceled).
        sent = (await only_event(blocking.send_message(request("wait for me", return_immediately=True)))).task
        check(not sent.status.state == TaskState.TASK_STATE_COMPLETED, "return_immediately does not wait")
        await wait_for_state(blocking, sent.id, TaskState.TASK_STATE_WORKING)
        canceled = await blocking.cancel_task(CancelTaskRequest(id=sent.id))
        check(state_name(canceled.status.state) == "TASK_STATE_CANCELED", "cancel stops a running task")
        try:
            await blocking.cancel_task(CancelTaskRequest(id=sent.id))
            raise AssertionError("a second cancel succeeded")
        except TaskNotCancelableError:
            check(True, "canceling a canceled task is TaskNotCancelable")

        # 6. resubscribe to a task that is working, with a push notification webhook on it.
        slow = (await only_event(blocking.send_message(request("slow one", return_immediately=True)))).task
        await wait_for_state(blocking, slow.id, TaskState.TASK_STATE_WORKING)
        hook = Webhook()
        made = await blocking.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=slow.id, url=hook.url, token="py-token")
        )
        check(made.id != "" and made.url == hook.url, f"a push config is created ({made})")
        got = await blocking.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=slow.id, id=made.id)
        )
        check(got.url == hook.url and got.token == "py-token", "and read back")
        listed = await blocking.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=slow.id)
        )
        check([c.id for c in listed.configs] == [made.id], "and listed")
        events = [e async for e in streaming.subscribe(SubscribeToTaskRequest(id=slow.id))]
        check(events[0].WhichOneof("payload") == "task", "a resubscription opens with the task")
        check(state_name(events[0].task.status.state) == "TASK_STATE_WORKING", "the task is still working")
        check(
            state_name(events[-1].status_update.status.state) == "TASK_STATE_COMPLETED",
            "the resubscription follows the task to its end",
        )
        resumed = assemble(e.artifact_update for e in events if e.HasField("artifact_update"))
        check(resumed == "Slow answer", f"the resubscription carries the answer ({resumed!r})")
        await asyncio.get_running_loop().run_in_executor(None, hook.done.wait, 10)
        check(hook.done.is_set(), f"the webhook heard the task's end ({len(hook.got)} notifications)")
        check(
            all(h.get("x-a2a-notification-token") == "py-token" for h, _ in hook.got),
            "every notification carries the config's token",
        )
        check(slow.id in json.dumps(hook.got[-1][1]), "and names the task")
        try:
            async for _ in streaming.subscribe(SubscribeToTaskRequest(id=slow.id)):
                pass
            raise AssertionError("subscribing to a finished task succeeded")
        except UnsupportedOperationError:
            check(True, "subscribing to a finished task is UnsupportedOperation")

    methods = {m for m, _ in calls}
    want = V1_METHODS if version == "1.0" else V03_METHODS
    if version == "0.3":
        want = want - {"ListTasks"}
    check(methods == want, f"the SDK used the {version} methods ({sorted(methods)})")
    check({v for _, v in calls} == {version}, f"with A2A-Version: {version}")

    # 7. No A2A-Version header: the 0.3 method names and shapes; 1.0 names are refused.
    rpc_url = keep[0].url
    async with httpx.AsyncClient(headers=headers, timeout=30) as raw:
        body = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "message/send",
            "params": {
                "message": {
                    "kind": "message",
                    "messageId": "raw-1",
                    "role": "user",
                    "parts": [{"kind": "text", "text": "no header"}],
                }
            },
        }
        r = (await raw.post(rpc_url, json=body)).json()
        check(r.get("id") == 7 and r["result"]["kind"] == "task", f"a headerless 0.3 send works ({r})")
        check(r["result"]["status"]["state"] == "completed", "and completes")
        body["method"] = "SendMessage"
        r = (await raw.post(rpc_url, json=body)).json()
        check(r["error"]["code"] == -32009, f"a 1.0 method without the header is VersionNotSupported ({r})")

    # 8. With a token: the card is public, the JSON-RPC endpoint is not.
    if token:
        async with httpx.AsyncClient(timeout=30) as anonymous:
            card = await anonymous.get(base.rstrip("/") + "/.well-known/agent-card.json")
            check(card.status_code == 200, "the card needs no token")
            check("bearer" in card.json().get("securitySchemes", {}), "the card names the bearer scheme")
            denied = await anonymous.post(rpc_url, json=body)
            check(denied.status_code == 401, f"the endpoint needs the token ({denied.status_code})")

    # 9. A task that runs when the server dies (its webhook listens), then the restart.
    await restart_phase(base, version, headers, hook, context_id, first.id, streamed_id)
    hook.close()


async def restart_phase(base, version, headers, hook, context_id, first_id, streamed_id):
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        client = await client_of(http, base, version)
        # A question to the client (INPUT_REQUIRED), answered after the restart.
        asked = (await only_event(client.send_message(request("weather please")))).task
        check(state_name(asked.status.state) == "TASK_STATE_INPUT_REQUIRED", "a question waits for the client")
        check(asked.status.message.parts[0].text == "Which city?", "and asks it")
        msg = new_text_message("run while the server dies", context_id=context_id, role=Role.ROLE_USER)
        req = SendMessageRequest(message=msg)
        req.configuration.return_immediately = True
        req.configuration.task_push_notification_config.url = hook.url
        req.configuration.task_push_notification_config.token = "py-token"
        doomed = (await only_event(client.send_message(req))).task
        working = await wait_for_state(client, doomed.id, TaskState.TASK_STATE_WORKING)
        conversation = working.metadata["troupe"]["conversationId"]
    print("RESTART", flush=True)
    new_base = (await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)).strip()
    check(new_base.startswith("http"), f"the restarted server is at {new_base}")
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        client = await client_of(http, new_base, version)
        back = await client.get_task(GetTaskRequest(id=first_id))
        check(state_name(back.status.state) == "TASK_STATE_COMPLETED", "an old task is found after the restart")
        check(back.history[0].parts[0].text == "hello", "with its history")
        check(answer_text(back) == "You said: hello", "and its answer")
        streamed = await client.get_task(GetTaskRequest(id=streamed_id))
        check(answer_text(streamed) == "Streamed answer", "the streamed task is found whole")
        failed = await wait_for_state(client, doomed.id, TaskState.TASK_STATE_FAILED)
        note = failed.status.message.parts[0].text
        check("interrupted by a restart" in note, f"the task the crash interrupted ends FAILED ({note})")
        await asyncio.get_running_loop().run_in_executor(None, hook.failed.wait, 20)
        check(hook.failed.is_set(), "its webhook hears it after the restart")
        after = (await only_event(client.send_message(request("after the restart", context_id)))).task
        check(state_name(after.status.state) == "TASK_STATE_COMPLETED", "the context takes a new message")
        check(after.context_id == context_id, "in the same context")
        check(after.metadata["troupe"]["conversationId"] == conversation, "and the same conversation")
        check(answer_text(after) == "You said: after the restart", f"which answers ({answer_text(after)!r})")
        if version == "1.0":
            page = await client.list_tasks(ListTasksRequest(context_id=context_id))
            ids = [t.id for t in page.tasks]
            check(page.total_size == 4, f"list finds the context's tasks from before and after ({page.total_size})")
            check(ids[0] == after.id and first_id in ids and doomed.id in ids, "newest first")
        # The question asked before the restart still waits; the answer, sent into the task
        # with its id, runs it again and stays in its history behind the question.
        waiting = await client.get_task(GetTaskRequest(id=asked.id))
        check(state_name(waiting.status.state) == "TASK_STATE_INPUT_REQUIRED", "the question still waits after the restart")
        reply = new_text_message("Paris", context_id=asked.context_id, task_id=asked.id, role=Role.ROLE_USER)
        answered = (await only_event(client.send_message(SendMessageRequest(message=reply)))).task
        check(answered.id == asked.id and state_name(answered.status.state) == "TASK_STATE_COMPLETED", "the answer completes the task")
        check(answer_text(answered) == "You said: Paris", f"with the model's reply ({answer_text(answered)!r})")
        full = await client.get_task(GetTaskRequest(id=asked.id))
        said = [m.parts[0].text for m in full.history]
        check(said == ["weather please", "Which city?", "Paris"], f"the follow-up is in the history ({said})")


async def client_of(http, base, version):
    """A client of the server at `base`, keeping only the card interface of `version`."""
    card = await A2ACardResolver(http, base).get_agent_card()
    keep = [i for i in card.supported_interfaces if i.protocol_version == version]
    del card.supported_interfaces[:]
    card.supported_interfaces.extend(keep)
    return ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)


def main():
    base, version = sys.argv[1], sys.argv[2]
    token = sys.argv[3] if len(sys.argv) > 3 else None
    asyncio.run(run(base, version, token))
    print("all checks passed", flush=True)


if __name__ == "__main__":
    main()
