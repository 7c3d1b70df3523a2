"""Drives `troupe acp` with the official ACP Python SDK (agent-client-protocol on PyPI).

    python client_e2e.py TROUPE_BIN DATA_DIR SCRIPT RELOAD_SCRIPT

The first `troupe acp` runs the scripted model from SCRIPT, which must hold these replies in
order:
1. text "Hello from troupe" (streamed in chunks);
2. a shell call `touch MARKER`, which troupe asks approval for (approval policy `always`);
3. text "done";
4. a hang that honours cancellation;
and the second one (same DATA_DIR, the session loaded) runs RELOAD_SCRIPT: text "after reload".
Checks each step and exits 0, or raises (non-zero exit, traceback on stderr).
"""

import asyncio
import sys

from acp import PROTOCOL_VERSION, RequestError, text_block
from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse
from acp.stdio import spawn_agent_process


class Recorder:
    """A client that records updates and allows every permission request once."""

    def __init__(self):
        self.updates = []
        self.permissions = []

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        self.permissions.append((tool_call, options))
        allow = next(o for o in options if o.kind == "allow_once")
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=allow.option_id))

    async def session_update(self, session_id, update, **kwargs):
        self.updates.append(update)

    def kinds(self):
        return [u.session_update for u in self.updates]

    def text(self, kind="agent_message_chunk"):
        return "".join(u.content.text for u in self.updates if u.session_update == kind)


def troupe(bin_path, data_dir, script):
    return (
        bin_path,
        "acp",
        "--script", script,
        "--data-dir", data_dir,
        "--approval-policy", "always",
        "--sandbox-policy", "full-access",
    )


async def first_run(bin_path, data_dir, script):
    client = Recorder()
    async with spawn_agent_process(client, *troupe(bin_path, data_dir, script)) as (conn, _proc):
        init = await conn.initialize(protocol_version=PROTOCOL_VERSION)
        assert init.protocol_version == 1, init
        assert init.agent_capabilities.load_session, init
        assert init.agent_info.name == "troupe", init

        session = await conn.new_session(cwd=data_dir)
        sid = session.session_id

        r = await conn.prompt(session_id=sid, prompt=[text_block("hello")])
        assert r.stop_reason == "end_turn", r
        assert client.text() == "Hello from troupe", client.updates
        assert client.kinds().count("agent_message_chunk") > 1, "not streamed: %r" % client.kinds()

        client.updates.clear()
        r = await conn.prompt(session_id=sid, prompt=[text_block("make the marker")])
        assert r.stop_reason == "end_turn", r
        assert len(client.permissions) == 1, client.permissions
        tool_call, options = client.permissions[0]
        assert "touch" in (tool_call.title or ""), tool_call
        assert {o.kind for o in options} >= {"allow_once", "reject_once"}, options
        kinds = client.kinds()
        assert "tool_call" in kinds and "tool_call_update" in kinds, kinds
        done = [u for u in client.updates if u.session_update == "tool_call_update"]
        assert done[-1].status == "completed", done
        assert client.text() == "done", client.updates

        client.updates.clear()
        prompt = asyncio.create_task(conn.prompt(session_id=sid, prompt=[text_block("hang")]))
        await asyncio.sleep(0.5)
        await conn.cancel(session_id=sid)
        r = await asyncio.wait_for(prompt, 10)
        assert r.stop_reason == "cancelled", r
        return sid


async def second_run(bin_path, data_dir, script, sid):
    client = Recorder()
    async with spawn_agent_process(client, *troupe(bin_path, data_dir, script)) as (conn, _proc):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        await conn.load_session(cwd=data_dir, session_id=sid)
        replayed_user = client.text("user_message_chunk")
        assert "hello" in replayed_user and "make the marker" in replayed_user, client.updates
        assert "Hello from troupe" in client.text(), client.updates

        client.updates.clear()
        r = await conn.prompt(session_id=sid, prompt=[text_block("still there?")])
        assert r.stop_reason == "end_turn", r
        assert client.text() == "after reload", client.updates

        try:
            await conn.load_session(cwd=data_dir, session_id="0190a000-0000-7000-8000-000000000000")
        except RequestError as e:
            assert e.code == -32002, e
        else:
            raise AssertionError("an unknown session loaded")


async def main():
    bin_path, data_dir, script, reload_script = sys.argv[1:5]
    sid = await first_run(bin_path, data_dir, script)
    await second_run(bin_path, data_dir, reload_script, sid)
    print("ok", sid)


if __name__ == "__main__":
    asyncio.run(main())
