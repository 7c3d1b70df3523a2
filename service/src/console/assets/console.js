// troupe's web console. Plain JavaScript, no library, no build step: the server renders
// every page so that it reads without this script; the script makes it live.
//
// The session view keeps one rule for not losing or repeating anything: stored messages
// are keyed by message_id (merging a page twice changes nothing), events by seq (an event at
// or below the last seq seen is dropped), and the event stream resumes after the last seq
// seen, across dropped connections and restarts of the service.

const $ = (sel, root = document) => root.querySelector(sel);

/** An element: h('li', {class: 'x', dataset: {id: 1}, onclick: f}, 'text', child, ...). */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function show(el, on) { if (el) el.hidden = !on; }

function ago(ms) {
  const s = Math.round((Date.now() - ms) / 1000);
  if (s < 5) return 'just now';
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(ms).toLocaleString();
}

function timeEl(ms) {
  return h('time', { dataset: { ms }, title: new Date(ms).toISOString() }, ago(ms));
}

function refreshTimes() {
  for (const t of document.querySelectorAll('time[data-ms]')) {
    const ms = Number(t.dataset.ms);
    t.textContent = ago(ms);
    t.title = new Date(ms).toISOString();
  }
}

function short(id) { return id ? String(id).slice(-8) : '—'; }

function fmtMs(ms) {
  if (ms === undefined || ms === null) return '';
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
}

function pretty(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch { return text; }
}

class SignedOut extends Error {}

/** Calls the service. 401: the sign-in has lapsed; the page shows the sign-in form. */
async function http(method, path, body) {
  const init = { method, headers: { accept: 'application/json' }, credentials: 'same-origin' };
  if (body !== undefined) {
    init.headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  if (r.status === 401) { signedOut(); throw new SignedOut('signed out'); }
  const text = await r.text();
  const value = text ? JSON.parse(text) : null;
  if (!r.ok) throw new Error(value && value.message ? value.message : `${r.status}`);
  return value;
}

let rpcId = 0;
async function rpc(method, params) {
  const v = await http('POST', '/rpc', { jsonrpc: '2.0', id: ++rpcId, method, params });
  if (v.error) throw new Error(v.error.message || `error ${v.error.code}`);
  return v.result;
}

function setConn(state, text) {
  const c = $('#conn');
  if (!c) return;
  c.dataset.state = state;
  c.textContent = text;
}

function signedOut() {
  setConn('signed-out', 'signed out');
  // The page itself answers the sign-in form now.
  setTimeout(() => window.location.reload(), 300);
}

/* ---------------------------------------------------------------- sign-in */

function signInPage() {
  const form = $('#sign-in-form');
  const err = $('#sign-in-error');
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    show(err, false);
    const token = $('#token').value;
    const r = await fetch('/console/sign-in', {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ token }),
    }).catch(() => null);
    if (r && r.status === 204) {
      const next = form.elements.next.value || '/';
      window.location.assign(next.startsWith('/') && !next.startsWith('//') ? next : '/');
      return;
    }
    err.textContent = r ? 'That token is not valid.' : 'The service does not answer.';
    show(err, true);
    $('#token').select();
  });
}

/* ---------------------------------------------------------------- session list */

function sessionsPage() {
  const q = $('#q');
  const rows = () => [...document.querySelectorAll('#sessions tbody tr')];
  const total = rows().length;
  const filter = () => {
    const words = q.value.toLowerCase().split(/\s+/).filter(Boolean);
    let n = 0;
    for (const tr of rows()) {
      // The title and id, the project and the status: not the activity time or the buttons.
      const hay = [0, 1, 2].map((i) => (tr.cells[i] ? tr.cells[i].textContent : '')).join(' ').toLowerCase();
      const on = words.every((w) => hay.includes(w));
      tr.hidden = !on;
      if (on) n += 1;
    }
    const plural = total === 1 ? 'session' : 'sessions';
    $('#count').textContent = words.length ? `${n} of ${total} ${plural} match` : `${total} ${plural}`;
  };
  q.addEventListener('input', filter);
  document.addEventListener('keydown', (e) => {
    if (e.key === '/' && document.activeElement.tagName !== 'INPUT'
        && document.activeElement.tagName !== 'TEXTAREA') {
      e.preventDefault();
      q.focus();
    }
  });

  show($('#create'), true);
  $('#create-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const err = $('#create-error');
    show(err, false);
    const project = $('#new-project').value.trim();
    const title = $('#new-title').value.trim();
    const body = {};
    if (project) body.project_id = project;
    if (title) body.title = title;
    try {
      const s = await http('POST', '/api/sessions', body);
      window.location.assign(`/sessions/${s.session_id}`);
    } catch (x) {
      if (x instanceof SignedOut) return;
      err.textContent = `Could not create the session: ${x.message}`;
      show(err, true);
    }
  });

  for (const b of document.querySelectorAll('.make-current')) {
    show(b, true);
    b.addEventListener('click', async () => {
      const tr = b.closest('tr');
      b.disabled = true;
      try {
        await http('PUT', `/api/projects/${encodeURIComponent(tr.dataset.project)}/current-session`,
          { session_id: tr.dataset.sessionId });
        window.location.reload();
      } catch (x) {
        b.disabled = false;
        if (!(x instanceof SignedOut)) b.textContent = `Failed: ${x.message}`;
      }
    });
  }
  refreshTimes();
  setInterval(refreshTimes, 15000);
}

/* ---------------------------------------------------------------- session view */

const EVENT_TYPES = ['text_delta', 'tool_call', 'error', 'message_complete', 'approval_requested',
  'approval_resolved', 'message_status', 'status_update'];
const MAX_EVENTS_SHOWN = 400;
// What a page open for days keeps: an Events entry's JSON is cut at EVENT_TEXT_MAX characters;
// finished tasks (their text and tool calls dropped once their stored messages show),
// dispatches, tool durations and trace ids are kept for the newest MAX_KEPT of each; routing
// decisions for the ROUTES_SHOWN the Agents panel draws.
const EVENT_TEXT_MAX = 4096;
const MAX_KEPT = 200;
const ROUTES_SHOWN = 20;
const AGENT_KINDS = new Set(['route_decided', 'dispatch_sent', 'dispatch_result', 'session_bound',
  'session_resumed', 'policy_rejected', 'agent_update', 'ask_human']);

function sessionPage() {
  const boot = JSON.parse($('#boot').textContent);
  const session = boot.session;
  const sid = session.session_id;
  const S = {
    lastSeq: boot.replay_from || 0,
    liveFrom: boot.last_seq || 0,
    messages: new Map(),
    older: undefined, // the `before` cursor of the next older page; null at the start
    conversations: [],
    approvals: new Map(),
    tasks: new Map(), // task_id -> live state of a task seen in events (the newest MAX_KEPT settled)
    durations: new Map(), // call_id -> ms (the newest MAX_KEPT)
    traces: new Map(), // task_id -> trace id (the newest MAX_KEPT)
    agents: { routes: [], dispatches: new Map(), bindings: new Map() },
    es: null,
    retry: 500,
    timer: null,
  };
  window.troupeConsole = S;

  /** Sets `key` in `map`, dropping the oldest entries beyond `max`. */
  function keep(map, key, value, max = MAX_KEPT) {
    map.delete(key);
    map.set(key, value);
    for (const k of map.keys()) {
      if (map.size <= max) break;
      map.delete(k);
    }
  }

  /* ---- messages ---- */
  const list = $('#messages');
  list.textContent = ''; // the server's copy; rendered again below

  function traceLink(taskId) {
    const trace = S.traces.get(taskId);
    if (!trace) return null;
    const label = `trace ${trace}`;
    if (boot.trace_url) {
      const href = boot.trace_url.replace('{trace_id}', encodeURIComponent(trace));
      return h('a', { class: 'trace mono', href, target: '_blank', rel: 'noopener noreferrer' }, label);
    }
    return h('span', { class: 'trace mono' }, label);
  }

  function convLabel(cid) {
    if (S.conversations.length < 2) return null;
    const i = S.conversations.findIndex((c) => c.conversation_id === cid);
    return h('span', { class: 'conv' }, i === 0 ? 'root' : `conversation ${i + 1}`);
  }

  function messageEl(m) {
    const meta = m.metadata || {};
    const who = [];
    let body;
    const text = m.content === null || m.content === undefined
      ? h('span', { class: 'muted' }, `(${m.chars} characters, not stored)`)
      : m.content === '' ? h('span', { class: 'muted' }, '(no text)') : m.content;
    switch (m.type) {
      case 'tool_call':
        who.push(h('b', {}, `→ ${meta.tool || 'tool'}`), h('span', { class: 'mono' }, meta.call_id));
        body = h('pre', { class: 'args' }, typeof text === 'string' ? pretty(text) : text);
        break;
      case 'tool_result': {
        const ms = S.durations.get(meta.call_id);
        who.push(h('b', {}, `← ${meta.tool || 'tool'}`), h('span', { class: 'mono' }, meta.call_id));
        if (meta.is_error) who.push(h('span', { class: 'status status-error' }, 'error'));
        if (ms !== undefined) who.push(h('span', { class: 'duration' }, fmtMs(ms)));
        body = h('pre', { class: 'output' }, text);
        break;
      }
      case 'status':
        who.push(h('b', {}, 'status'), h('span', { class: `status status-${meta.status}` }, meta.status));
        body = h('div', { class: 'text' }, text);
        break;
      default:
        who.push(h('b', {}, m.role === 'user' ? 'you' : m.role));
        if (m.status) who.push(h('span', { class: `status status-${m.status}` }, m.status));
        body = h('div', { class: 'text' }, text);
    }
    const conv = convLabel(m.conversation_id);
    if (conv) who.push(conv);
    who.push(timeEl(m.created_ms));
    if (m.task_id && (m.role !== 'user' || m.reply_message_id)) {
      const t = traceLink(m.task_id);
      if (t && (m.type === 'text' || m.type === 'status') && m.role !== 'user') who.push(t);
    }
    return h('li', {
      class: `msg msg-${m.type} role-${m.role}`,
      dataset: { messageId: m.message_id, taskId: m.task_id || '' },
    }, h('div', { class: 'who' }, who), body);
  }

  function placeMessage(m) {
    const prev = S.messages.get(m.message_id);
    S.messages.set(m.message_id, m);
    const el = messageEl(m);
    const old = prev && list.querySelector(`li[data-message-id="${m.message_id}"]`);
    if (old) { old.replaceWith(el); return; }
    // Keep the list in message_id order, whichever page a message came with.
    let after = null;
    for (const li of list.children) {
      if (Number(li.dataset.messageId) > m.message_id) { after = li; break; }
    }
    list.insertBefore(el, after);
  }

  /** Whether the reader is at the bottom: new messages then keep the view there. */
  function atBottom() {
    return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 120;
  }
  function stayAtBottom(was) {
    if (was) window.scrollTo(0, document.documentElement.scrollHeight);
  }

  function merge(messages, { older = false } = {}) {
    const was = !older && atBottom();
    for (const m of messages) placeMessage(m);
    settleTasks();
    stayAtBottom(was);
  }

  function rerenderMessages() {
    for (const m of S.messages.values()) placeMessage(m);
  }

  function setOlder(cursor) {
    S.older = cursor;
    show($('#older'), cursor !== null && cursor !== undefined);
    show($('#start'), cursor === null);
  }

  async function loadNewest() {
    // Pages back from the newest until one overlaps what is shown: nothing in between is skipped.
    let before = null;
    let first = true;
    for (let i = 0; i < 50; i += 1) {
      const q = before === null ? '' : `&before=${before}`;
      const page = await http('GET', `/api/sessions/${sid}/messages?limit=${boot.page_size}${q}`);
      const overlaps = page.messages.some((m) => S.messages.has(m.message_id)) || S.messages.size === 0;
      merge(page.messages);
      if (first && S.older === undefined) setOlder(page.next_before);
      first = false;
      if (overlaps || page.next_before === null) return;
      before = page.next_before;
    }
  }

  $('#older').addEventListener('click', async () => {
    const b = $('#older');
    b.disabled = true;
    try {
      const page = await http('GET', `/api/sessions/${sid}/messages?limit=${boot.page_size}&before=${S.older}`);
      const top = list.firstElementChild;
      merge(page.messages, { older: true });
      setOlder(page.next_before);
      if (top) top.scrollIntoView({ block: 'start' });
    } catch (x) {
      if (!(x instanceof SignedOut)) b.textContent = `Load older messages (failed: ${x.message})`;
    } finally {
      b.disabled = false;
    }
  });

  let newestTimer = null;
  function refreshNewestSoon() {
    clearTimeout(newestTimer);
    newestTimer = setTimeout(() => loadNewest().catch(report), 80);
  }

  /* ---- tasks in flight ---- */
  const live = $('#live');

  function task(taskId, cid) {
    let t = S.tasks.get(taskId);
    if (!t) {
      t = { id: taskId, conversation_id: cid, text: '', tools: new Map(), status: 'running', usage: null, el: null };
      S.tasks.set(taskId, t);
    }
    return t;
  }

  function renderTask(t) {
    if (t.settled) { if (t.el) t.el.remove(); t.el = null; return; }
    const tools = [...t.tools.values()].map((c) => h('div', { class: 'tool', dataset: { callId: c.call_id } },
      h('div', { class: 'who' }, h('b', {}, `→ ${c.name}`), h('span', { class: 'mono' }, c.call_id),
        c.duration_ms !== undefined ? h('span', { class: 'duration' }, fmtMs(c.duration_ms)) : h('span', { class: 'muted' }, 'running…'),
        c.is_error ? h('span', { class: 'status status-error' }, 'error') : null),
      h('pre', { class: 'args' }, pretty(c.arguments)),
      c.output !== undefined ? h('pre', { class: 'output' }, c.output) : null));
    const who = [h('b', {}, 'assistant'), h('span', { class: `status status-${t.status}` }, t.status),
      h('span', { class: 'mono' }, `task ${short(t.id)}`)];
    const trace = traceLink(t.id);
    if (trace) who.push(trace);
    if (t.usage) who.push(h('span', {}, `${t.usage.input_tokens} in / ${t.usage.output_tokens} out tokens`));
    const cancel = t.status === 'running'
      ? h('button', { type: 'button', class: 'danger cancel-task', onclick: () => cancelTask(t.id) }, 'Cancel') : null;
    const el = h('div', { class: 'task-live', dataset: { taskId: t.id } },
      h('div', { class: 'who' }, who, cancel),
      h('div', { class: 'stream' }, t.text), tools);
    if (t.el) t.el.replaceWith(el); else live.append(el);
    t.el = el;
  }

  let renderQueued = new Set();
  let renderTimer = null;
  function renderTaskSoon(t) {
    renderQueued.add(t);
    if (renderTimer) return;
    renderTimer = requestAnimationFrame(() => {
      renderTimer = null;
      const q = renderQueued;
      renderQueued = new Set();
      const was = atBottom();
      for (const x of q) renderTask(x);
      stayAtBottom(was);
    });
  }

  /** A finished task's live block gives way once its stored messages are shown. */
  function settleTasks() {
    for (const t of [...S.tasks.values()]) {
      if (t.status === 'running' || t.settled) continue;
      const stored = [...S.messages.values()].some((m) => m.task_id === t.id && m.role !== 'user');
      if (stored) settle(t);
    }
  }

  /** A task that is over and shown by its stored messages (or older than them): never drawn
   *  live again. Its streamed text and tool calls go; the newest MAX_KEPT such tasks are
   *  remembered (so that a late event of theirs draws nothing). */
  function settle(t) {
    t.settled = true;
    t.text = '';
    t.tools = new Map();
    renderTask(t);
    let extra = [...S.tasks.values()].filter((x) => x.settled).length - MAX_KEPT;
    for (const [id, x] of S.tasks) {
      if (extra <= 0) break;
      if (x.settled) { S.tasks.delete(id); extra -= 1; }
    }
  }

  async function cancelTask(taskId) {
    try { await rpc('task.cancel', { session_id: sid, task_id: taskId }); } catch (x) { report(x); }
    refreshTasks();
  }

  async function refreshTasks() {
    try {
      const tasks = await rpc('task.list', { session_id: sid });
      const ul = $('#tasks');
      ul.textContent = '';
      for (const t of tasks) {
        ul.append(h('li', { dataset: { taskId: t.task_id } },
          h('span', { class: `status status-${t.state}` }, t.state),
          h('span', { class: 'mono' }, `task ${short(t.task_id)}`),
          convLabel(t.conversation_id), timeEl(t.started_at_ms),
          h('button', { type: 'button', class: 'danger', onclick: () => cancelTask(t.task_id) }, 'Cancel')));
      }
      show($('#tasks-empty'), tasks.length === 0);
    } catch (x) { report(x); }
  }

  /* ---- approvals ---- */
  function renderApprovals() {
    const ul = $('#approvals');
    const n = S.approvals.size;
    $('#approvals-count').textContent = String(n);
    $('#approvals-count').classList.toggle('hot', n > 0);
    show($('#approvals-empty'), n === 0);
    for (const li of [...ul.children]) {
      if (!S.approvals.has(li.dataset.approvalId)) li.remove();
    }
    for (const a of S.approvals.values()) {
      if (ul.querySelector(`li[data-approval-id="${a.approval_id}"]`)) continue;
      ul.append(approvalEl(a));
    }
  }

  function approvalEl(a) {
    const id = a.approval_id;
    const ttlId = `ttl-${id}`;
    const reasonId = `deny-${id}`;
    const subject = a.subject && typeof a.subject === 'object' ? a.subject : null;
    const elicit = subject && subject.mcp_elicitation;
    const question = subject && subject.agent_question;
    const what = elicit ? `${elicit.server} asks: ${elicit.message}`
      : question ? `${question.agent_id} asks: ${question.question}`
        : subject && subject.mcp_sampling ? `${subject.mcp_sampling.server} asks to use the model`
          : `$ ${(a.command || []).join(' ')}`;
    const respond = async (decision, button) => {
      for (const b of li.querySelectorAll('button')) b.disabled = true;
      button.textContent += '…';
      try {
        await rpc('approval.respond', { session_id: sid, approval_id: id, decision });
        S.approvals.delete(id);
        renderApprovals();
      } catch (x) {
        for (const b of li.querySelectorAll('button')) b.disabled = false;
        button.textContent = button.textContent.replace(/…$/, '');
        report(x);
      }
    };
    const ttl = () => {
      const v = Number($(`#${CSS.escape(ttlId)}`).value);
      return v > 0 ? v : null;
    };
    // A request that takes content (an MCP server's form, a remote agent's question) is
    // answered with it and never remembered; a command is approved once or for a while.
    const answer = elicit ? elicitationForm(id, elicit.schema, respond)
      : question ? questionForm(id, respond) : null;
    const li = h('li', { class: 'approval', dataset: { approvalId: id } },
      h('div', { class: 'cmd' }, what),
      a.reason ? h('div', { class: 'muted' }, a.reason) : null,
      h('div', { class: 'who' }, convLabel(a.conversation_id), a.task_id ? h('span', { class: 'mono' }, `task ${short(a.task_id)}`) : null,
        a.deadline_ms ? h('span', {}, 'answer before ', timeEl(a.deadline_ms)) : null),
      answer || [
        h('div', { class: 'actions' },
          h('button', { type: 'button', class: 'approve-once', onclick: (e) => respond('approve_once', e.currentTarget) }, 'Approve once'),
          h('button', { type: 'button', class: 'secondary approve-conversation', onclick: (e) => respond({ approve_for_conversation: { ttl_secs: ttl() } }, e.currentTarget) }, 'For this conversation'),
          h('button', { type: 'button', class: 'secondary approve-session', onclick: (e) => respond({ approve_for_session: { ttl_secs: ttl() } }, e.currentTarget) }, 'For the session')),
        h('div', { class: 'actions' },
          h('label', { for: ttlId }, 'remember for'),
          h('select', { id: ttlId, class: 'ttl' },
            h('option', { value: '0' }, 'ever'), h('option', { value: '300' }, '5 minutes'),
            h('option', { value: '3600' }, '1 hour'), h('option', { value: '86400' }, '1 day')))],
      h('div', { class: 'actions' },
        h('label', { for: reasonId, class: 'sr-only' }, 'Reason for denying'),
        h('input', { id: reasonId, class: 'deny-reason', placeholder: 'reason (optional)' }),
        h('button', { type: 'button', class: 'danger deny', onclick: (e) => respond({ deny: { reason: $(`#${CSS.escape(reasonId)}`).value.trim() || null } }, e.currentTarget) },
          elicit ? 'Decline' : 'Deny')));
    return li;
  }

  /** The form of an MCP elicitation: one field per property of its (flat) schema, filled
   *  with the schema's defaults; sent as the content the server asked for. */
  function elicitationForm(id, schema, respond) {
    const props = (schema && typeof schema === 'object' && schema.properties) || {};
    const required = new Set(Array.isArray(schema && schema.required) ? schema.required : []);
    const fields = Object.entries(props).map(([name, p], i) => {
      const fid = `f-${id}-${i}`;
      const label = `${(p && p.title) || name}${required.has(name) ? ' *' : ''}`;
      const many = p.type === 'array';
      const options = choices(many ? p.items : p);
      let input;
      if (p.type === 'boolean') {
        input = h('input', { id: fid, type: 'checkbox', checked: p.default === true });
      } else if (options) {
        // A choice (enum, enumNames, oneOf/anyOf of const + title), or several (an array
        // of them: a multiple select, Ctrl/Shift + arrows or click).
        const chosen = new Set(many ? (Array.isArray(p.default) ? p.default : []) : [p.default]);
        input = h('select', { id: fid, required: required.has(name) || (many && p.minItems > 0), multiple: many, size: many ? Math.min(options.length, 5) : null },
          !many && (!required.has(name) || p.default === undefined) ? h('option', { value: '' }, '') : null,
          options.map((o) => h('option', { value: o.value, selected: chosen.has(o.value) }, o.label)));
      } else {
        const numeric = p.type === 'number' || p.type === 'integer';
        const type = numeric ? 'number' : p.format === 'email' ? 'email' : p.format === 'uri' ? 'url' : p.format === 'date' ? 'date' : 'text';
        input = h('input', {
          id: fid, type, required: required.has(name),
          step: p.type === 'integer' ? '1' : numeric ? 'any' : null,
          min: p.minimum, max: p.maximum, minlength: p.minLength, maxlength: p.maxLength,
          value: p.default !== undefined ? String(p.default) : null,
        });
      }
      input.dataset.field = name;
      input.dataset.type = p.type || 'string';
      return h('div', { class: 'field' }, h('label', { for: fid }, label),
        p.description ? h('div', { class: 'muted' }, p.description) : null, input);
    });
    const send = h('button', { type: 'submit', class: 'answer-send' }, 'Send');
    const form = h('form', { class: 'answer', onsubmit: (e) => {
      e.preventDefault();
      const content = {};
      for (const el of form.querySelectorAll('[data-field]')) {
        const t = el.dataset.type;
        if (t === 'boolean') { content[el.dataset.field] = el.checked; continue; }
        if (t === 'array') { content[el.dataset.field] = [...el.selectedOptions].map((o) => o.value); continue; }
        if (el.value === '') continue;
        content[el.dataset.field] = t === 'number' || t === 'integer' ? Number(el.value) : el.value;
      }
      respond({ approve_with_content: { content } }, send);
    } }, fields, h('div', { class: 'actions' }, send));
    return form;
  }

  /** The choices a schema offers, as {value, label}: `enum` (with the older `enumNames`
   *  for labels), or `oneOf`/`anyOf` of `{const, title}`; null when it offers none. */
  function choices(p) {
    if (!p || typeof p !== 'object') return null;
    if (Array.isArray(p.enum)) {
      const names = Array.isArray(p.enumNames) ? p.enumNames : [];
      return p.enum.map((v, k) => ({ value: String(v), label: String(names[k] ?? v) }));
    }
    const list = Array.isArray(p.oneOf) ? p.oneOf : Array.isArray(p.anyOf) ? p.anyOf : null;
    if (!list || !list.every((o) => o && 'const' in o)) return null;
    return list.map((o) => ({ value: String(o.const), label: String(o.title ?? o.const) }));
  }

  /** A remote agent's question: a text answer, sent back to the agent. */
  function questionForm(id, respond) {
    const fid = `answer-${id}`;
    const text = h('textarea', { id: fid, class: 'answer-text', rows: 2, required: true });
    const send = h('button', { type: 'submit', class: 'answer-send' }, 'Answer');
    const form = h('form', { class: 'answer', onsubmit: (e) => {
      e.preventDefault();
      const answer = text.value.trim();
      if (!answer) { text.focus(); return; }
      respond({ approve_with_content: { content: { answer } } }, send);
    } }, h('label', { for: fid }, 'Your answer'), text, h('div', { class: 'actions' }, send));
    return form;
  }

  async function refreshApprovals() {
    try {
      const pending = await rpc('approval.list', { session_id: sid });
      S.approvals = new Map(pending.map((a) => [a.approval_id, a]));
      renderApprovals();
    } catch (x) { report(x); }
  }

  /* ---- conversations and statistics ---- */
  async function refreshConversations() {
    try {
      S.conversations = await rpc('conversation.list', { session_id: sid });
      const sel = $('#conversation');
      const chosen = sel.value;
      sel.textContent = '';
      const ul = $('#conversations');
      ul.textContent = '';
      S.conversations.forEach((c, i) => {
        const name = i === 0 ? 'root' : `conversation ${i + 1}`;
        const open = c.state === 'open' || c.state === undefined;
        if (open) sel.append(h('option', { value: c.conversation_id }, name));
        ul.append(h('li', { dataset: { conversationId: c.conversation_id } }, h('b', {}, name),
          h('span', { class: 'mono' }, short(c.conversation_id)),
          h('span', { class: `status status-${open ? 'active' : 'cancelled'}` }, c.state || 'open'),
          open ? h('button', { type: 'button', class: 'secondary', onclick: async () => {
            try { await http('POST', `/api/sessions/${sid}/conversations/${c.conversation_id}/cancel`); } catch (x) { report(x); }
            refreshTasks();
          } }, 'Cancel all') : null));
      });
      if (chosen && [...sel.options].some((o) => o.value === chosen)) sel.value = chosen;
      rerenderMessages();
      refreshStats();
    } catch (x) { report(x); }
  }

  let statsTimer = null;
  function refreshStatsSoon() { clearTimeout(statsTimer); statsTimer = setTimeout(refreshStats, 200); }
  async function refreshStats() {
    const total = { tasks: 0, tasks_failed: 0, tasks_cancelled: 0, input: 0, output: 0, cached: 0, tool_calls: 0, mcp_calls: 0 };
    for (const c of S.conversations) {
      if (c.state && c.state !== 'open') continue;
      try {
        const s = await rpc('conversation.stats', { session_id: sid, conversation_id: c.conversation_id });
        total.tasks += s.tasks; total.tasks_failed += s.tasks_failed; total.tasks_cancelled += s.tasks_cancelled;
        total.input += s.usage.input_tokens; total.output += s.usage.output_tokens; total.cached += s.usage.cached_tokens;
        total.tool_calls += s.tool_calls; total.mcp_calls += s.mcp_calls;
      } catch (x) { if (x instanceof SignedOut) return; }
    }
    const dl = $('#stats');
    dl.textContent = '';
    const row = (k, v, key) => dl.append(h('dt', {}, k), h('dd', { dataset: { stat: key } }, String(v)));
    row('tasks', total.tasks, 'tasks');
    row('failed', total.tasks_failed, 'failed');
    row('cancelled', total.tasks_cancelled, 'cancelled');
    row('tokens in', total.input, 'input_tokens');
    row('tokens out', total.output, 'output_tokens');
    row('cached tokens', total.cached, 'cached_tokens');
    row('tool calls', total.tool_calls, 'tool_calls');
    row('MCP calls', total.mcp_calls, 'mcp_calls');
  }

  $('#new-conversation').addEventListener('click', async () => {
    try {
      const r = await rpc('conversation.open', { session_id: sid });
      await refreshConversations();
      $('#conversation').value = r.conversation_id;
      $('#text').focus();
    } catch (x) { report(x); }
  });
  show($('#new-conversation'), true);

  let sessionTimer = null;
  function refreshSessionSoon() {
    clearTimeout(sessionTimer);
    sessionTimer = setTimeout(async () => {
      try {
        const r = await http('GET', `/api/sessions/${sid}`);
        const st = $('#status');
        st.textContent = r.status;
        st.className = `status status-${r.status}`;
      } catch (x) { report(x); }
    }, 150);
  }

  /* ---- the composer ---- */
  const composer = $('#composer');
  show(composer, true);
  async function send() {
    const area = $('#text');
    const text = area.value;
    if (!text.trim()) return;
    const err = $('#send-error');
    show(err, false);
    $('#send').disabled = true;
    try {
      const params = { session_id: sid, text };
      if ($('#conversation').value) params.conversation_id = $('#conversation').value;
      const r = await rpc('conversation.send', params);
      area.value = '';
      merge([r.message]);
      list.lastElementChild?.scrollIntoView({ block: 'nearest' });
    } catch (x) {
      if (!(x instanceof SignedOut)) { err.textContent = `Not sent: ${x.message}`; show(err, true); }
    } finally {
      $('#send').disabled = false;
      area.focus();
    }
  }
  composer.addEventListener('submit', (e) => { e.preventDefault(); send(); });
  $('#text').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });

  /* ---- agents: routing decisions, the dispatch tree, bindings ---- */
  function agentEvent(ev) {
    const d = ev.data || {};
    const A = S.agents;
    // An event read back under a policy that keeps no content has its headers only: a route's
    // decision, source and confidence are under `route`, the agent beside it, a dispatch's
    // outcome under `dispatch`.
    if (ev.kind === 'route_decided') {
      A.routes.push({ seq: ev.seq, agent_id: d.agent_id, ...(d.route || d) });
    } else if (ev.kind === 'dispatch_sent') {
      // What the tree draws (not the dispatch's input).
      keep(A.dispatches, d.dispatch_id, { seq: ev.seq, dispatch_id: d.dispatch_id, agent_id: d.agent_id, chain: d.chain, provider_session_id: d.provider_session_id, status: 'running' });
    } else if (ev.kind === 'dispatch_result') {
      const x = A.dispatches.get(d.dispatch_id) || { seq: ev.seq, dispatch_id: d.dispatch_id, agent_id: d.agent_id, chain: [d.agent_id] };
      keep(A.dispatches, d.dispatch_id, { ...x, status: d.status || d.dispatch, duration_ms: d.duration_ms, provider_session_id: d.provider_session_id || x.provider_session_id });
    } else if (ev.kind === 'session_bound' || ev.kind === 'session_resumed') {
      A.bindings.set(d.agent_id, { provider: d.provider, provider_session_id: d.provider_session_id, kind: ev.kind });
    } else if (ev.kind === 'policy_rejected') {
      A.routes.push({ seq: ev.seq, decision: 'policy_rejected', agent_id: d.agent_id, reason: d.message || d.reason });
    }
    if (A.routes.length > ROUTES_SHOWN) A.routes.splice(0, A.routes.length - ROUTES_SHOWN);
    renderAgentsSoon();
  }

  let agentsTimer = null;
  function renderAgentsSoon() { if (!agentsTimer) agentsTimer = setTimeout(() => { agentsTimer = null; renderAgents(); }, 50); }
  function renderAgents() {
    const A = S.agents;
    const box = $('#agents');
    box.textContent = '';
    if (A.routes.length) {
      box.append(h('h3', {}, 'Routing'), h('ul', { class: 'routes' }, A.routes.map((r) => h('li', { dataset: { seq: r.seq } },
        h('b', {}, r.decision), r.agent_id ? ` → ${r.agent_id}` : '', r.module ? ` (${r.module})` : '',
        r.confidence !== undefined ? h('span', { class: 'muted' }, ` ${Math.round(r.confidence * 100)}%`) : '',
        r.source ? h('span', { class: 'muted' }, ` by ${r.source}`) : '',
        r.reason ? h('div', { class: 'muted' }, r.reason) : null))));
    }
    if (A.dispatches.size) {
      const sorted = [...A.dispatches.values()].sort((a, b) => a.seq - b.seq);
      box.append(h('h3', {}, 'Dispatches'), h('ul', { class: 'tree' }, sorted.map((d) => {
        const chain = Array.isArray(d.chain) ? d.chain : [d.agent_id];
        const li = h('li', { dataset: { dispatchId: d.dispatch_id, depth: chain.length - 1 } },
          h('b', {}, d.agent_id), ' ', h('span', { class: `status status-${d.status}` }, d.status),
          d.duration_ms !== undefined ? ` ${fmtMs(d.duration_ms)}` : '',
          h('div', { class: 'muted' }, chain.join(' → ')),
          d.provider_session_id ? h('div', { class: 'mono' }, `bound to ${d.provider_session_id}`) : null);
        // Indented by depth (the CSSOM, which the page's CSP allows; a style attribute it does not).
        li.style.marginLeft = `${Math.max(0, chain.length - 2) * 14}px`;
        return li;
      })));
    }
    if (A.bindings.size) {
      box.append(h('h3', {}, 'Bindings'), h('ul', {}, [...A.bindings.entries()].map(([agent, b]) =>
        h('li', {}, h('b', {}, agent), ` ${b.provider || ''} `, h('span', { class: 'mono' }, b.provider_session_id)))));
    }
    if (!box.childElementCount) box.append(h('p', { class: 'muted' }, 'No routing or dispatch yet.'));
  }

  /* ---- the event log: every kind, known or not ---- */
  const log = $('#events');
  function logEvent(ev) {
    const data = ev.data === null || ev.data === undefined ? '' : JSON.stringify(ev.data);
    const summary = h('summary', {}, h('span', { class: 'mono' }, `#${ev.seq} `), h('span', { class: 'kind' }, ev.kind),
      ev.task_id ? h('span', { class: 'muted mono' }, ` task ${short(ev.task_id)}`) : '',
      data && data !== '{}' ? h('span', { class: 'muted' }, ` ${data.length > 90 ? `${data.slice(0, 90)}…` : data}`) : '');
    let whole = JSON.stringify(ev, null, 2);
    if (whole.length > EVENT_TEXT_MAX) {
      whole = `${whole.slice(0, EVENT_TEXT_MAX)}… (${whole.length - EVENT_TEXT_MAX} more characters)`;
    }
    log.prepend(h('li', { dataset: { seq: ev.seq, kind: ev.kind } },
      h('details', {}, summary, h('pre', {}, whole))));
    while (log.children.length > MAX_EVENTS_SHOWN) log.lastElementChild.remove();
  }

  /* ---- applying one event ---- */
  function apply(ev) {
    logEvent(ev);
    const d = ev.data || {};
    const replay = ev.seq <= S.liveFrom;
    switch (ev.kind) {
      case 'task_started': {
        const t = task(ev.task_id, ev.conversation_id);
        t.status = 'running';
        renderTaskSoon(t);
        if (!replay) refreshTasks();
        break;
      }
      case 'assistant_chunk': {
        const t = task(ev.task_id, ev.conversation_id);
        if (t.settled) break;
        t.text += d.delta || '';
        renderTaskSoon(t);
        break;
      }
      case 'tool_call_started': {
        const t = task(ev.task_id, ev.conversation_id);
        if (t.settled) break;
        // Headers only (a policy that keeps no content): the tool's name and call id, no
        // arguments.
        const c = d.call || { call_id: d.call_id, name: d.tool, arguments: '(not kept)' };
        t.tools.set(c.call_id, { call_id: c.call_id, name: c.name, arguments: typeof c.arguments === 'string' ? c.arguments : JSON.stringify(c.arguments) });
        renderTaskSoon(t);
        break;
      }
      case 'tool_call_finished': {
        keep(S.durations, d.call_id, d.duration_ms);
        const t = task(ev.task_id, ev.conversation_id);
        if (!t.settled) {
          const c = t.tools.get(d.call_id) || { call_id: d.call_id, name: d.name || d.tool, arguments: '' };
          Object.assign(c, { output: d.output === undefined ? '(not kept)' : d.output, is_error: d.is_error, duration_ms: d.duration_ms });
          t.tools.set(d.call_id, c);
          renderTaskSoon(t);
        }
        for (const m of S.messages.values()) {
          if (m.type === 'tool_result' && m.metadata && m.metadata.call_id === d.call_id) placeMessage(m);
        }
        break;
      }
      case 'step_finished': {
        if (d.usage) {
          const t = task(ev.task_id, ev.conversation_id);
          const u = t.usage || { input_tokens: 0, output_tokens: 0 };
          u.input_tokens += d.usage.input_tokens || 0;
          u.output_tokens += d.usage.output_tokens || 0;
          t.usage = u;
          renderTaskSoon(t);
        }
        break;
      }
      case 'task_finished':
      case 'task_aborted': {
        const t = task(ev.task_id, ev.conversation_id);
        t.status = ev.kind === 'task_aborted' ? 'aborted' : (d.status || 'ok');
        // In full, the trace id is among the task's statistics; read back as headers, beside them.
        const trace = (d.stats && d.stats.trace_id) || d.trace_id;
        if (trace) keep(S.traces, ev.task_id, trace);
        // Finished before the page went live: the stored messages show it (or it is older
        // than they are); it is never drawn live.
        if (replay) settle(t); else renderTaskSoon(t);
        for (const m of S.messages.values()) if (m.task_id === ev.task_id) placeMessage(m);
        refreshNewestSoon();
        if (!replay) { refreshTasks(); refreshStatsSoon(); }
        break;
      }
      case 'approval_requested':
        // Headers only: which approval is not known from the event; the pending list says.
        if (d.approval_id === undefined) { refreshApprovals(); break; }
        S.approvals.set(d.approval_id, { ...d, conversation_id: ev.conversation_id, task_id: ev.task_id });
        renderApprovals();
        break;
      case 'approval_resolved':
        if (d.approval_id === undefined) { refreshApprovals(); break; }
        S.approvals.delete(d.approval_id);
        renderApprovals();
        break;
      case 'message_updated': {
        const m = S.messages.get(d.message_id);
        if (m) placeMessage({ ...m, status: d.status, task_id: d.task_id || m.task_id, reply_message_id: d.reply_message_id || m.reply_message_id });
        refreshNewestSoon();
        // An outcome is stored with the conversation's statistics and the session's status.
        if (!replay && d.status !== 'running' && d.status !== 'queued') { refreshStatsSoon(); refreshSessionSoon(); }
        break;
      }
      case 'conversation_opened':
      case 'conversation_closed':
        if (!replay) refreshConversations();
        break;
      default:
        if (AGENT_KINDS.has(ev.kind)) agentEvent(ev);
    }
  }

  function onEvent(e) {
    let ev;
    try { ev = JSON.parse(e.data); } catch { return; }
    if (typeof ev.seq !== 'number' || ev.seq <= S.lastSeq) return; // seen already
    S.lastSeq = ev.seq;
    apply(ev);
    if (ev.seq >= S.liveFrom && $('#conn').dataset.state !== 'live') setConn('live', 'live');
  }

  /* ---- the stream: resume after the last seq, whatever happened ---- */
  function connect() {
    clearTimeout(S.timer);
    if (S.es) S.es.close();
    const es = new EventSource(`/api/sessions/${sid}/events?after=${S.lastSeq}`);
    S.es = es;
    for (const t of EVENT_TYPES) es.addEventListener(t, onEvent);
    es.addEventListener('message', onEvent);
    es.addEventListener('stream_error', () => reconnect('the stream fell behind'));
    es.addEventListener('open', () => {
      S.retry = 500;
      setConn('live', 'live');
      show($('#send-error'), false);
      // What changed while the stream was down is in the events after lastSeq; the rest is
      // read again (idempotently).
      refreshNewestSoon();
      refreshApprovals();
      refreshTasks();
    });
    // A troupe `error` event arrives as an `error` event with data (a MessageEvent): it is
    // applied above; only the EventSource's own error (no data) is a lost connection.
    es.addEventListener('error', (e) => {
      if (typeof e.data === 'string') return;
      reconnect('connection lost');
    });
  }

  async function reconnect(why) {
    if (S.es) { S.es.close(); S.es = null; }
    setConn('reconnecting', `reconnecting (${why})…`);
    clearTimeout(S.timer);
    const wait = S.retry;
    S.retry = Math.min(S.retry * 2, 4000);
    S.timer = setTimeout(async () => {
      // A stream refused for a lapsed sign-in looks like any error to EventSource: ask.
      try { await http('GET', `/api/sessions/${sid}`); } catch (x) {
        if (x instanceof SignedOut) return;
        reconnect('the service does not answer');
        return;
      }
      connect();
    }, wait);
  }

  function report(x) {
    if (x instanceof SignedOut) return;
    // The service out of reach: the connection indicator says so, and the stream's
    // reconnection reads everything again.
    if (x instanceof TypeError) return;
    const err = $('#send-error');
    err.textContent = x.message;
    show(err, true);
  }

  // For people debugging in the browser's console: the state, and how an event is shown.
  S.apply = apply;

  setConn('connecting', 'connecting…');
  (async () => {
    try {
      if (boot.last_seq === null) {
        // Another node runs the session: its head comes from there (forwarded), read before
        // the messages, so that what happens after it reaches the page as an event. Without
        // it, the page still loads and replays from the start.
        try {
          const head = await http('GET', `/api/sessions/${sid}/events/head`);
          S.liveFrom = head.last_seq;
          S.lastSeq = Math.max(0, head.last_seq - boot.replay_events);
        } catch (x) { report(x); }
      }
      await refreshConversations();
      await loadNewest();
      window.scrollTo(0, document.documentElement.scrollHeight);
      await refreshApprovals();
      await refreshTasks();
    } catch (x) { report(x); }
    connect();
  })();
  setInterval(refreshTimes, 15000);
}

/* ---------------------------------------------------------------- start */

switch (document.body.dataset.page) {
  case 'sign-in': signInPage(); break;
  case 'sessions': sessionsPage(); break;
  case 'session': sessionPage(); break;
  default: break;
}
