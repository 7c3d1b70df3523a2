#!/usr/bin/env node
// Drives troupe's A2A endpoint with the official JS A2A SDK client (@a2a-js/sdk).
//
// Usage: node client_e2e.mjs BASE_URL VERSION [TOKEN]
//   BASE_URL  where `troupe serve` listens, e.g. http://127.0.0.1:8080
//   VERSION   1.0 or 0.3: the card interface the client keeps (0.3: the SDK's compat transport)
//   TOKEN     bearer token, when the server wants one
// The SDK is read from $A2A_JS_SDK (default: .tools/a2a-js/node_modules/@a2a-js/sdk).
//
// Halfway it prints "RESTART" and reads one line from stdin: the base URL of the server
// started again over the same data directory (killed with SIGKILL meanwhile). Then it checks
// that the context goes on and that the old tasks are found.
//
// The server's scripted model must answer, in this order (one model call per task):
//   before the restart:
//   1. default (echoes "You said: hello")                             send, blocking
//   2. {"text": "Streamed answer", "chunk_chars": 4, "delay_ms": 300}  streamed
//   3. {"hang": true}                                                  sent at once, then canceled
//   4. {"text": "Slow answer", "delay_ms": 1500}                       resubscribed, with a webhook
//   5. {"a2a": {"state": "input-required", "text": "Which city?"}}     answered after the restart
//   6. {"hang": true}                                                  running when the server dies
//   after the restart: default answers.
//
// Prints one line per check and "all checks passed" when every one holds.

import http from 'node:http';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const sdkDir =
  process.env.A2A_JS_SDK ?? path.join(here, '..', '..', '.tools', 'a2a-js', 'node_modules', '@a2a-js', 'sdk');
const load = (p) => import(pathToFileURL(path.join(sdkDir, 'dist', p)).href);
const C = await load('client/index.js');
const { Role, TaskState } = await load('index.js');

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
  console.log(`ok: ${what}`);
}

const stateName = (s) => TaskState[s];
const text = (parts) => parts.map((p) => (p.content?.$case === 'text' ? p.content.value : '')).join('');
const answer = (task) => task.artifacts.map((a) => text(a.parts)).join('');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The artifact's text as a client builds it: `append` adds to it, otherwise replaces. */
function assemble(updates) {
  let out = '';
  for (const u of updates) {
    const piece = text(u.artifact.parts);
    out = u.append ? out + piece : piece;
  }
  return out;
}

function message(textValue, extra = {}) {
  return {
    messageId: `js-${Math.random().toString(36).slice(2)}`,
    role: Role.ROLE_USER,
    parts: [{ content: { $case: 'text', value: textValue } }],
    ...extra,
  };
}

function request(textValue, { contextId, taskId, returnImmediately = false, push } = {}) {
  const extra = contextId ? { contextId } : {};
  if (taskId) extra.taskId = taskId;
  const configuration = { returnImmediately };
  if (push) configuration.taskPushNotificationConfig = push;
  return { message: message(textValue, extra), configuration };
}

async function waitForState(client, taskId, want) {
  for (let i = 0; i < 200; i++) {
    const t = await client.getTask({ id: taskId });
    if (t.status.state === want) return t;
    await sleep(50);
  }
  throw new Error(`task ${taskId} never reached ${stateName(want)}`);
}

/** A push notification receiver on loopback: every POST's headers and JSON body. */
class Webhook {
  constructor() {
    this.got = [];
    this.waiters = [];
    this.server = http.createServer((req, res) => {
      let body = '';
      req.on('data', (c) => (body += c));
      req.on('end', () => {
        this.got.push({ headers: req.headers, body: JSON.parse(body) });
        res.writeHead(200).end();
        for (const w of this.waiters.splice(0)) w();
      });
    });
  }
  async start() {
    await new Promise((r) => this.server.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${this.server.address().port}/hook`;
  }
  /** Waits until a notification carries `state` for `taskId`. */
  async heard(taskId, state) {
    const seen = () =>
      this.got.some((n) => {
        const s = JSON.stringify(n.body);
        return s.includes(taskId) && s.includes(state);
      });
    for (let i = 0; i < 200 && !seen(); i++) {
      await Promise.race([new Promise((r) => this.waiters.push(r)), sleep(100)]);
    }
    return seen();
  }
  close() {
    this.server.close();
  }
}

/** A client of the server at `base`, over the card interface of `version`. */
async function connect(base, version, token) {
  const fetchImpl = (url, init = {}) => {
    const headers = new Headers(init.headers ?? {});
    if (token) headers.set('Authorization', `Bearer ${token}`);
    return fetch(url, { ...init, headers });
  };
  const legacy = { enabled: true };
  const resolver = new C.DefaultAgentCardResolver({ fetchImpl, legacyCompat: legacy });
  const card = await resolver.resolve(base);
  const versions = card.supportedInterfaces.map((i) => i.protocolVersion).sort();
  check(JSON.stringify(versions) === '["0.3","1.0"]', `the card offers 1.0 and 0.3 (${versions})`);
  check(card.capabilities.streaming, 'the card declares streaming');
  // Keep only the interface under test.
  card.supportedInterfaces = card.supportedInterfaces.filter((i) => i.protocolVersion === version);
  const factory = new C.ClientFactory(
    C.ClientFactoryOptions.createFrom(C.ClientFactoryOptions.default, {
      transports: [new C.JsonRpcTransportFactory({ fetchImpl, legacyCompat: legacy })],
      cardResolver: resolver,
    }),
  );
  const client = await factory.createFromAgentCard(card);
  check(client.protocolVersion === version, `the client speaks ${version}`);
  return client;
}

async function readLine() {
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    rl.close();
    return line.trim();
  }
  throw new Error('stdin closed before the restarted server was named');
}

async function main() {
  const [base, version, token] = process.argv.slice(2);
  let client = await connect(base, version, token);

  // 1. send (blocking): a completed task with the answer as an artifact.
  const first = await client.sendMessage(request('hello'));
  check(first.status && stateName(first.status.state) === 'TASK_STATE_COMPLETED', 'send completes the task');
  check(answer(first) === 'You said: hello', `send answers (${answer(first)})`);
  const contextId = first.contextId;
  check(contextId !== '', 'the task has a context');
  const conversationId = first.metadata?.troupe?.conversationId;

  // 2. stream, in the same context: the answer arrives in pieces, then whole.
  const events = [];
  for await (const e of client.sendMessageStream(request('stream please', { contextId }))) events.push(e.payload);
  const cases = events.map((e) => e.$case);
  check(cases[0] === 'task', `a stream opens with the task (${cases})`);
  const states = events.filter((e) => e.$case === 'statusUpdate').map((e) => stateName(e.value.status.state));
  check(states[0] === 'TASK_STATE_WORKING', `the stream shows work (${states})`);
  check(states.at(-1) === 'TASK_STATE_COMPLETED', 'the stream ends completed');
  const updates = events.filter((e) => e.$case === 'artifactUpdate').map((e) => e.value);
  check(updates.length > 2, `the answer streams in pieces (${updates.length} updates)`);
  check(updates.some((u) => u.append), 'later pieces append to the artifact');
  check(updates.at(-1).lastChunk && !updates.at(-1).append, 'the last update is the whole answer');
  check(assemble(updates) === 'Streamed answer', `the stream carries the answer (${assemble(updates)})`);
  const streamedId = events[0].value.id;

  // 3. get: the first task with its full history.
  const got = await client.getTask({ id: first.id });
  check(got.id === first.id && stateName(got.status.state) === 'TASK_STATE_COMPLETED', 'get finds the task');
  check(text(got.history[0].parts) === 'hello', 'get returns the history');
  let unknown = null;
  try {
    await client.getTask({ id: 'no-such-task' });
  } catch (e) {
    unknown = e;
  }
  check(unknown !== null && /not found/i.test(unknown.message), `get of an unknown task fails (${unknown?.message})`);

  // 4. list (1.0; the 0.3 protocol has no ListTasks).
  if (version === '1.0') {
    const page = await client.listTasks({ contextId });
    const ids = page.tasks.map((t) => t.id);
    check(JSON.stringify(ids) === JSON.stringify([streamedId, first.id]), `list: the context's tasks, newest first`);
    check(page.totalSize === 2 && page.nextPageToken === '', 'list has one page of two');
  }

  // 5. cancel a task that runs (its model call hangs until canceled).
  const sent = await client.sendMessage(request('wait for me', { returnImmediately: true }));
  check(stateName(sent.status.state) !== 'TASK_STATE_COMPLETED', 'returnImmediately does not wait');
  await waitForState(client, sent.id, TaskState.TASK_STATE_WORKING);
  const canceled = await client.cancelTask({ id: sent.id });
  check(stateName(canceled.status.state) === 'TASK_STATE_CANCELED', 'cancel stops a running task');
  let again = null;
  try {
    await client.cancelTask({ id: sent.id });
  } catch (e) {
    again = e;
  }
  check(again !== null && /cancel/i.test(again.message), `canceling it again fails (${again?.message})`);

  // 6. resubscribe to a working task, with a webhook on it.
  const hook = new Webhook();
  await hook.start();
  const slow = await client.sendMessage(request('slow one', { returnImmediately: true }));
  await waitForState(client, slow.id, TaskState.TASK_STATE_WORKING);
  const made = await client.createTaskPushNotificationConfig({ taskId: slow.id, url: hook.url, token: 'js-token' });
  check(made.id !== '' && made.url === hook.url, 'a push config is created');
  const read = await client.getTaskPushNotificationConfig({ taskId: slow.id, id: made.id });
  check(read.url === hook.url && read.token === 'js-token', 'and read back');
  const resumed = [];
  for await (const e of client.resubscribeTask({ id: slow.id })) resumed.push(e.payload);
  check(resumed[0].$case === 'task', 'a resubscription opens with the task');
  check(stateName(resumed.at(-1).value.status.state) === 'TASK_STATE_COMPLETED', 'and follows it to its end');
  const slowText = assemble(resumed.filter((e) => e.$case === 'artifactUpdate').map((e) => e.value));
  check(slowText === 'Slow answer', `the resubscription carries the answer (${slowText})`);
  const completedName = version === '1.0' ? 'TASK_STATE_COMPLETED' : 'completed';
  check(await hook.heard(slow.id, completedName), 'the webhook hears the task end');
  check(hook.got.every((n) => n.headers['x-a2a-notification-token'] === 'js-token'), 'with the token');

  // 7. A question to the client (INPUT_REQUIRED), answered after the restart; a task that
  // runs when the server dies, with a webhook; then the restart.
  const asked = await client.sendMessage(request('weather please'));
  check(stateName(asked.status.state) === 'TASK_STATE_INPUT_REQUIRED', 'a question waits for the client');
  check(text(asked.status.message.parts) === 'Which city?', 'and asks it');
  const doomed = await client.sendMessage(
    request('run while the server dies', {
      contextId,
      returnImmediately: true,
      push: { url: hook.url, token: 'js-token' },
    }),
  );
  await waitForState(client, doomed.id, TaskState.TASK_STATE_WORKING);
  console.log('RESTART');
  const newBase = await readLine();
  client = await connect(newBase, version, token);

  // 8. After the restart: old tasks are found, with their history and artifacts.
  const back = await client.getTask({ id: first.id });
  check(stateName(back.status.state) === 'TASK_STATE_COMPLETED', 'an old task is found after the restart');
  check(text(back.history[0].parts) === 'hello', 'with its history');
  check(answer(back) === 'You said: hello', 'and its answer');
  const streamedBack = await client.getTask({ id: streamedId });
  check(answer(streamedBack) === 'Streamed answer', 'the streamed task is found whole');
  // The running one ended FAILED, not run again; its webhook heard it.
  const failed = await waitForState(client, doomed.id, TaskState.TASK_STATE_FAILED);
  check(/interrupted by a restart/.test(text(failed.status.message.parts)), 'the task the crash interrupted ends FAILED');
  const failedName = version === '1.0' ? 'TASK_STATE_FAILED' : 'failed';
  check(await hook.heard(doomed.id, failedName), 'its webhook hears it after the restart');
  hook.close();
  // The context goes on, in the same conversation.
  const after = await client.sendMessage(request('after the restart', { contextId }));
  check(stateName(after.status.state) === 'TASK_STATE_COMPLETED', 'the context takes a new message');
  check(after.contextId === contextId, 'in the same context');
  check(after.metadata?.troupe?.conversationId === conversationId, 'and the same conversation');
  check(answer(after) === 'You said: after the restart', `which answers (${answer(after)})`);
  if (version === '1.0') {
    const page = await client.listTasks({ contextId });
    const ids = page.tasks.map((t) => t.id);
    check(page.totalSize === 4, `list finds the context's tasks from before and after (${page.totalSize})`);
    check(ids.includes(first.id) && ids.includes(doomed.id) && ids[0] === after.id, 'newest first');
  }
  // The question asked before the restart still waits; the answer, sent into the task with
  // its id, runs it again and stays in its history behind the question.
  const waiting = await client.getTask({ id: asked.id });
  check(stateName(waiting.status.state) === 'TASK_STATE_INPUT_REQUIRED', 'the question still waits after the restart');
  const answered = await client.sendMessage(request('Paris', { contextId: asked.contextId, taskId: asked.id }));
  check(answered.id === asked.id && stateName(answered.status.state) === 'TASK_STATE_COMPLETED', 'the answer completes the task');
  check(answer(answered) === 'You said: Paris', `with the model's reply (${answer(answered)})`);
  const full = await client.getTask({ id: asked.id });
  const said = full.history.map((m) => text(m.parts));
  check(JSON.stringify(said) === JSON.stringify(['weather please', 'Which city?', 'Paris']), `the follow-up is in the history (${said})`);
  console.log('all checks passed');
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
