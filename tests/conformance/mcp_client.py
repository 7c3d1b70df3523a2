#!/usr/bin/env python3
"""troupe as the client of the MCP conformance suite (npm @modelcontextprotocol/conformance).

The suite starts a scenario's servers and runs this script with the MCP server URL as its last
argument, the scenario in MCP_CONFORMANCE_SCENARIO and, for some, client credentials in
MCP_CONFORMANCE_CONTEXT. The script does what a troupe user does: writes a troupe.toml naming
the server (with an `oauth` table), runs `troupe mcp login` and plays the browser (it opens
the authorization URL the command prints and follows the redirect back to troupe's loopback
listener), then runs one `troupe chat --once` turn whose scripted model calls the server's
tool; when `troupe mcp status` then says the server asked for more scope (a step-up), it
logs in again, as a user would, and runs the turn again. TROUPE_BIN names the troupe binary.
"""

import json
import os
import subprocess
import sys
import tempfile
import urllib.request

SERVER = "conformance"


def toml_string(value):
    return json.dumps(value)


def oauth_table(scenario, context):
    """The `oauth` table for this scenario."""
    fields = {}
    if scenario.startswith("auth/client-credentials"):
        fields["grant"] = "client_credentials"
    if "client_id" in context:
        fields["client_id"] = context["client_id"]
    if "client_secret" in context:
        fields["client_secret_env"] = "CONFORMANCE_CLIENT_SECRET"
    if scenario == "auth/basic-cimd":
        # A client id metadata document troupe's operator would host (SEP-991).
        fields["client_metadata_url"] = "https://conformance-test.local/client-metadata.json"
    return "{ " + ", ".join(f"{k} = {toml_string(v)}" for k, v in fields.items()) + " }"


def browse(url):
    """Opens the authorization URL and follows its redirects, as a browser would."""
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            response.read()
    except Exception as error:  # the login reports what went wrong
        print(f"browser: {error}", file=sys.stderr)


def login(troupe, env):
    child = subprocess.Popen(
        [troupe, "mcp", "login", SERVER, "--timeout", "20s"],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    url = child.stdout.readline().strip()
    if url.startswith("http"):
        browse(url)
    child.stdout.read()
    return child.wait(timeout=30)


def main():
    url = sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    troupe = os.environ["TROUPE_BIN"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TROUPE_"))}
    env.pop("BROWSER", None)
    if "client_secret" in context:
        env["CONFORMANCE_CLIENT_SECRET"] = context["client_secret"]
    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)
        with open("troupe.toml", "w") as f:
            f.write(
                f'data_dir = "data"\n'
                f"[[mcp.servers]]\n"
                f'name = "{SERVER}"\n'
                f'type = "streamable_http"\n'
                f"url = {toml_string(url)}\n"
                f"oauth = {oauth_table(scenario, context)}\n"
            )
        with open("script.json", "w") as f:
            json.dump(
                {"replies": [{"tool_calls": [{"name": f"{SERVER}__test-tool", "arguments": {}}]}]},
                f,
            )
        code = login(troupe, env)
        if code != 0:
            return code
        code = once(troupe, env)
        # A server that wants more scope for a call (step-up): `troupe mcp status` says to log
        # in again, and the new login asks for it. A user does this at most once here.
        status = subprocess.run(
            [troupe, "mcp", "status"], stdin=subprocess.DEVNULL, env=env,
            capture_output=True, text=True, timeout=30,
        )
        if "asked for more scope" in status.stdout:
            code = login(troupe, env)
            if code != 0:
                return code
            code = once(troupe, env)
        return code


def once(troupe, env):
    """One turn whose scripted model calls the server's tool."""
    return subprocess.run(
        [troupe, "chat", "--once", "--ephemeral", "--script", "script.json",
         "--approvals", "approve", "--elicitation", "defaults", "call the tool"],
        stdin=subprocess.DEVNULL,
        env=env,
        timeout=60,
    ).returncode


if __name__ == "__main__":
    sys.exit(main())
