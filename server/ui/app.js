/* darkserve web page: chat over the native sessions API, the session list
 * (open, fork, delete, export, import), sampling settings and the API key.
 *
 * Model output and anything else that comes from the server is put into the
 * page as text only (textContent, text nodes): never as HTML. The markdown
 * subset below builds DOM nodes itself. The server's Content-Security-Policy
 * runs scripts from this origin only, as a second line of defence.
 *
 * The server keeps a session's state, not its text, so the transcript of a
 * conversation is kept in this browser's storage, by session id.
 */
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);

  // ---- storage (may be unavailable: private windows, disabled storage) ----
  const store = {
    get(k) { try { return window.localStorage.getItem(k); } catch (e) { return null; } },
    set(k, v) { try { window.localStorage.setItem(k, v); } catch (e) { /* not kept */ } },
    del(k) { try { window.localStorage.removeItem(k); } catch (e) { /* nothing kept */ } },
  };
  const KEY = 'darkserve.apiKey';
  const SETTINGS = 'darkserve.settings';
  const CURRENT = 'darkserve.current';
  const transcriptKey = (id) => 'darkserve.transcript.' + id;

  function loadTranscript(id) {
    try {
      const t = JSON.parse(store.get(transcriptKey(id)) || 'null');
      if (t && Array.isArray(t.turns)) return t;
    } catch (e) { /* a damaged entry reads as none */ }
    return { system: null, turns: [], note: null, known: false };
  }
  function saveTranscript(id, t) {
    t.known = true;
    store.set(transcriptKey(id), JSON.stringify(t));
  }

  // ---- small helpers ----
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    if (props) {
      for (const [k, v] of Object.entries(props)) {
        if (k === 'text') e.textContent = v;
        else if (k === 'class') e.className = v;
        else if (v !== undefined && v !== null) e.setAttribute(k, v);
      }
    }
    for (const c of children) if (c) e.append(c);
    return e;
  }
  function fmtBytes(n) {
    if (typeof n !== 'number') return '–';
    if (n < 1024) return n + ' B';
    if (n < 1024 * 1024) return (n / 1024).toFixed(1) + ' KiB';
    if (n < 1024 * 1024 * 1024) return (n / 1048576).toFixed(2) + ' MiB';
    return (n / 1073741824).toFixed(2) + ' GiB';
  }
  function attnText(a) {
    if (!a || !a.kind) return '–';
    const parts = [a.kind];
    if (a.features) parts.push(a.features + ' features');
    if (a.window) parts.push('window ' + a.window);
    return parts.join(', ');
  }
  let statusTimer = null;
  function status(msg, isError) {
    const s = $('status');
    s.textContent = msg;
    s.classList.toggle('error', !!isError);
    clearTimeout(statusTimer);
    if (msg && !isError) statusTimer = setTimeout(() => { s.textContent = ''; }, 6000);
  }

  // ---- HTTP ----
  class ApiError extends Error {
    constructor(status, message, code) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }
  async function toError(r) {
    let msg = 'HTTP ' + r.status;
    let code = null;
    try {
      const j = await r.json();
      if (j && j.error) {
        msg = j.error.message || msg;
        code = j.error.code || null;
      }
    } catch (e) { /* not JSON */ }
    return new ApiError(r.status, msg, code);
  }
  /* fetch with the API key; a 401 asks for the key once and retries. */
  async function api(method, path, opts) {
    const o = opts || {};
    for (let attempt = 0; ; attempt++) {
      const headers = new Headers(o.headers || {});
      const key = store.get(KEY);
      if (key) headers.set('Authorization', 'Bearer ' + key);
      let body = o.body;
      if (o.json !== undefined) {
        headers.set('Content-Type', 'application/json');
        body = JSON.stringify(o.json);
      }
      const r = await fetch(path, { method, headers, body, signal: o.signal, cache: 'no-store' });
      if (r.status === 401 && attempt === 0) {
        const why = key ? 'The server refused the stored key.' : 'This server needs an API key.';
        if (await askKey(why)) continue;
      }
      if (!r.ok) throw await toError(r);
      return r;
    }
  }
  async function apiJson(method, path, opts) {
    const r = await api(method, path, opts);
    return r.json();
  }

  // ---- API key dialog ----
  let keyWaiters = [];
  function askKey(why) {
    const d = $('key-dialog');
    $('key-why').textContent = (why ? why + ' ' : '') +
      'The key is kept in this browser\'s storage and sent as "Authorization: Bearer".';
    $('key-input').value = store.get(KEY) || '';
    if (!d.open) d.showModal();
    $('key-input').focus();
    return new Promise((resolve) => keyWaiters.push(resolve));
  }
  function closeKey(saved) {
    $('key-dialog').close();
    const w = keyWaiters;
    keyWaiters = [];
    for (const resolve of w) resolve(saved);
  }

  // ---- markdown subset: paragraphs, code fences, inline code, bold,
  //      italic, lists, headings; built from text nodes only ----
  const INLINE = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*|__(?=\S)([\s\S]*?\S)__|\*(?=[^\s*])([\s\S]*?[^\s*])\*(?!\*)|(^|[^\w])_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/g;
  function appendInline(parent, text) {
    const re = new RegExp(INLINE.source, 'g'); // own lastIndex: this recurses
    let pos = 0;
    let m;
    while ((m = re.exec(text)) !== null) {
      const start = m.index + (m[7] !== undefined ? m[6].length : 0); // keep the char before _
      if (start > pos) parent.append(text.slice(pos, start)); // a string appends a text node
      if (m[2] !== undefined) {
        parent.append(el('code', { text: m[2] }));
      } else if (m[3] !== undefined || m[4] !== undefined) {
        const b = el('strong');
        appendInline(b, m[3] !== undefined ? m[3] : m[4]);
        parent.append(b);
      } else {
        const i = el('em');
        appendInline(i, m[5] !== undefined ? m[5] : m[7]);
        parent.append(i);
      }
      pos = m.index + m[0].length;
    }
    if (pos < text.length) parent.append(text.slice(pos));
  }

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
  const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  function closesFence(line, marker) {
    const m = /^ {0,3}(`{3,}|~{3,})\s*$/.exec(line);
    return !!m && m[1][0] === marker[0] && m[1].length >= marker.length;
  }

  function renderMarkdown(container, src) {
    const frag = document.createDocumentFragment();
    const lines = src.split('\n');
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const fence = FENCE.exec(line);
      if (fence) {
        const marker = fence[1];
        const body = [];
        i++;
        while (i < lines.length && !closesFence(lines[i], marker)) {
          body.push(lines[i]);
          i++;
        }
        i++; // the closing fence (or the end of a reply still streaming)
        frag.append(codeBlock(body.join('\n'), fence[2]));
        continue;
      }
      if (line.trim() === '') { i++; continue; }
      const h = HEADING.exec(line);
      if (h) {
        const p = el('p', { class: 'md-heading' });
        appendInline(p, h[2]);
        frag.append(p);
        i++;
        continue;
      }
      const item = ITEM.exec(line);
      if (item) {
        const ordered = /\d/.test(item[2]);
        const list = el(ordered ? 'ol' : 'ul');
        if (ordered && parseInt(item[2], 10) !== 1) list.setAttribute('start', String(parseInt(item[2], 10)));
        while (i < lines.length) {
          const it = ITEM.exec(lines[i]);
          if (!it || /\d/.test(it[2]) !== ordered) break;
          let text = it[3];
          i++;
          // continuation lines: indented, not a new item, not blank
          while (i < lines.length && /^\s+\S/.test(lines[i]) && !ITEM.exec(lines[i]) && !FENCE.exec(lines[i])) {
            text += '\n' + lines[i].trim();
            i++;
          }
          const li = el('li');
          appendInline(li, text);
          list.append(li);
        }
        frag.append(list);
        continue;
      }
      const para = [];
      while (i < lines.length && lines[i].trim() !== '' && !FENCE.exec(lines[i]) &&
             !HEADING.exec(lines[i]) && !ITEM.exec(lines[i])) {
        para.push(lines[i]);
        i++;
      }
      const p = el('p');
      appendInline(p, para.join('\n'));
      frag.append(p);
    }
    container.replaceChildren(frag);
  }

  function codeBlock(code, lang) {
    const copy = el('button', { type: 'button', class: 'small copy-code', text: 'Copy code' });
    copy.addEventListener('click', () => copyText(code, copy, 'Copy code'));
    const pre = el('pre', null, el('code', { text: code }));
    return el('div', { class: 'codeblock' },
      el('div', { class: 'row' }, el('span', { class: 'lang', text: lang || 'code' }), copy), pre);
  }

  async function copyText(text, btn, label) {
    let ok = true;
    try {
      await navigator.clipboard.writeText(text);
    } catch (e) {
      // no clipboard API (plain http on another host): a selected textarea
      const ta = el('textarea', { class: 'sr-only', readonly: '' });
      ta.value = text;
      document.body.append(ta);
      ta.select();
      try { ok = document.execCommand('copy'); } catch (e2) { ok = false; }
      ta.remove();
      btn.focus();
    }
    btn.textContent = ok ? 'Copied' : 'Copy failed';
    status(ok ? 'Copied to the clipboard.' : 'Could not copy.', !ok);
    setTimeout(() => { btn.textContent = label; }, 1500);
  }

  // ---- the conversation view ----
  function messageEl(role, text) {
    const who = { user: 'You', assistant: 'Assistant', system: 'System', note: 'Note' }[role];
    const body = el('div', { class: 'msg-body' });
    const head = el('div', { class: 'msg-head' }, el('span', { class: 'who', text: who }));
    const art = el('article', { class: 'msg msg-' + role, 'aria-label': who }, head, body);
    if (role !== 'note') {
      const copy = el('button', { type: 'button', class: 'small copy', text: 'Copy',
                                   'aria-label': 'Copy this message' });
      copy.addEventListener('click', () => copyText(art.dataset.raw || '', copy, 'Copy'));
      head.append(copy);
    }
    setMessageText(art, text || '');
    return art;
  }
  function setMessageText(art, text) {
    art.dataset.raw = text;
    const body = art.querySelector('.msg-body');
    if (art.classList.contains('msg-assistant')) renderMarkdown(body, text);
    else body.replaceChildren(el('p', { text }));
  }
  function setMessageStatus(art, text, isError) {
    let s = art.querySelector('.msg-status');
    if (!text) { if (s) s.remove(); return; }
    if (!s) { s = el('p', { class: 'msg-status' }); art.append(s); }
    s.textContent = text;
    s.classList.toggle('error', !!isError);
  }
  function turnStatus(t) {
    if (t.error) return ['Error: ' + t.error, true];
    if (t.stopped) return ['Stopped.', false];
    if (t.finish === 'length') return ['Cut at the max tokens setting.', false];
    if (t.finish === 'timeout') return ['Cut by the server\'s generation timeout.', false];
    return ['', false];
  }

  function renderLog() {
    const log = $('log');
    const frag = document.createDocumentFragment();
    if (state.session) {
      const t = loadTranscript(state.session.id);
      if (!t.known) {
        frag.append(messageEl('note', 'This session was not started in this browser: the server ' +
          'keeps its state, not its text, so its history cannot be shown. You can continue it.'));
      }
      if (t.note) frag.append(messageEl('note', t.note));
      if (t.system) frag.append(messageEl('system', t.system));
      for (const turn of t.turns) {
        if (turn.user !== null && turn.user !== undefined) frag.append(messageEl('user', turn.user));
        const a = messageEl('assistant', turn.assistant || '');
        const [st, err] = turnStatus(turn);
        setMessageStatus(a, st, err);
        frag.append(a);
      }
    }
    log.replaceChildren(frag);
    log.scrollTop = log.scrollHeight;
  }

  // ---- application state ----
  const state = {
    session: null,     // the current session object (short or full form)
    controller: null,  // AbortController of the reply being streamed
    sessions: [],      // the last list
  };

  function setBusy(busy) {
    $('send').disabled = busy;
    $('stop').disabled = !busy;
    updateTurnButtons();
    for (const b of document.querySelectorAll('.session-list button')) b.disabled = busy;
    $('new-chat').disabled = busy;
    $('import-file').disabled = busy;
  }
  function updateTurnButtons() {
    const s = state.session;
    const busy = !!state.controller;
    const canUndo = !!(s && s.turns > 0 && Array.isArray(s.checkpoints) && s.checkpoints.length > 0);
    $('regen').disabled = busy || !canUndo;
    $('rollback').disabled = busy || !canUndo;
  }

  function showSession() {
    const s = state.session;
    const stats = $('info-stats');
    if (!s) {
      $('info-h').textContent = 'No session';
      $('info-text').textContent = 'Send a message to start a session.';
      stats.hidden = true;
      $('growth').hidden = true;
      $('m-state').textContent = '–';
      updateTurnButtons();
      return;
    }
    $('info-h').textContent = 'Session ' + s.id;
    stats.hidden = false;
    $('i-tokens').textContent = String(s.tokens);
    $('i-bytes').textContent = fmtBytes(s.state_bytes);
    $('i-attn').textContent = attnText(s.attention);
    $('i-turns').textContent = s.turns === undefined ? '–' : String(s.turns);
    $('m-state').textContent = fmtBytes(s.state_bytes) + ' / ' + s.tokens + ' tok';
    const kind = s.attention && s.attention.kind;
    $('info-text').textContent = !kind ? '' : kind === 'exact'
      ? 'Exact attention: the state is a KV cache that grows with every token.'
      : 'Linear attention: the state keeps the same size however long the conversation grows.';
    const rows = $('growth-rows');
    const cps = Array.isArray(s.checkpoints) ? s.checkpoints : [];
    const tr = [];
    for (const c of cps) {
      tr.push(el('tr', null, el('td', { text: String(c.turn) }), el('td', { text: String(c.tokens) }),
        el('td', { text: fmtBytes(c.bytes) })));
    }
    if (s.turns !== undefined) {
      tr.push(el('tr', null, el('td', { text: s.turns + ' (now)' }), el('td', { text: String(s.tokens) }),
        el('td', { text: fmtBytes(s.state_bytes) })));
    }
    rows.replaceChildren(...tr);
    $('growth').hidden = tr.length === 0;
    updateTurnButtons();
  }

  async function reloadSession() {
    if (!state.session) return;
    try {
      state.session = await apiJson('GET', '/v1/sessions/' + state.session.id);
    } catch (e) {
      if (e.status === 404) { state.session = null; store.del(CURRENT); renderLog(); }
      else status('Could not read the session: ' + e.message, true);
    }
    showSession();
  }

  // ---- sessions panel ----
  async function refreshList() {
    let list;
    try {
      list = await apiJson('GET', '/v1/sessions?limit=200');
    } catch (e) {
      status('Could not list the sessions: ' + e.message, true);
      return;
    }
    state.sessions = list.data || [];
    const ul = $('session-list');
    const items = [];
    for (const s of state.sessions) items.push(sessionItem(s));
    if (!items.length) items.push(el('li', { class: 'hint', text: 'No sessions yet.' }));
    ul.replaceChildren(...items);
    if (state.controller) setBusy(true);
  }

  function sessionTitle(s) {
    const t = loadTranscript(s.id);
    const first = t.turns.find((x) => x.user);
    const short = s.id.slice(0, 8);
    if (first) return first.user.slice(0, 60) + ' (' + short + ')';
    return 'Session ' + short;
  }

  function sessionItem(s) {
    const short = s.id.slice(0, 8);
    const open = el('button', { type: 'button', class: 'open', text: sessionTitle(s),
                                'aria-label': 'Open ' + sessionTitle(s) });
    open.addEventListener('click', () => openSession(s.id));
    const meta = el('p', { class: 'meta',
      text: s.tokens + ' tokens · ' + fmtBytes(s.state_bytes) + ' · ' +
            ((s.attention && s.attention.kind) || '?') + ' · ' + (s.turns || 0) + ' turns' });
    const fork = el('button', { type: 'button', class: 'small fork', text: 'Fork',
                                'aria-label': 'Fork session ' + short });
    fork.addEventListener('click', () => forkSession(s.id));
    const exp = el('button', { type: 'button', class: 'small export', text: 'Export',
                               'aria-label': 'Export session ' + short });
    exp.addEventListener('click', () => exportSession(s.id));
    const del = el('button', { type: 'button', class: 'small danger delete', text: 'Delete',
                               'aria-label': 'Delete session ' + short });
    del.addEventListener('click', () => armOrDelete(del, s.id, short));
    const li = el('li', { 'data-id': s.id }, open, meta, el('div', { class: 'row' }, fork, exp, del));
    if (state.session && state.session.id === s.id) li.setAttribute('aria-current', 'true');
    return li;
  }

  /* Delete takes two clicks: the first arms the button for 4 seconds. */
  function armOrDelete(btn, id, short) {
    if (btn.dataset.armed) {
      deleteSession(id);
      return;
    }
    btn.dataset.armed = '1';
    btn.textContent = 'Confirm delete';
    btn.setAttribute('aria-label', 'Confirm: delete session ' + short);
    status('Press again to delete session ' + short + '.');
    setTimeout(() => {
      delete btn.dataset.armed;
      btn.textContent = 'Delete';
      btn.setAttribute('aria-label', 'Delete session ' + short);
    }, 4000);
  }

  async function openSession(id) {
    if (state.controller) return;
    try {
      state.session = await apiJson('GET', '/v1/sessions/' + id);
    } catch (e) {
      status('Could not open the session: ' + e.message, true);
      return;
    }
    store.set(CURRENT, id);
    renderLog();
    showSession();
    markCurrent();
    $('prompt').focus();
  }
  function markCurrent() {
    for (const li of $('session-list').children) {
      if (state.session && li.dataset.id === state.session.id) li.setAttribute('aria-current', 'true');
      else li.removeAttribute('aria-current');
    }
  }

  async function forkSession(id) {
    try {
      const s = await apiJson('POST', '/v1/sessions/' + id + '/fork');
      const t = loadTranscript(id);
      if (t.known) {
        t.note = 'Forked from session ' + id.slice(0, 8) + '.';
        saveTranscript(s.id, t);
      }
      status('Forked session ' + id.slice(0, 8) + ' into ' + s.id.slice(0, 8) + '.');
      await refreshList();
      await openSession(s.id);
    } catch (e) {
      status('Fork failed: ' + e.message, true);
    }
  }

  async function deleteSession(id) {
    try {
      await api('DELETE', '/v1/sessions/' + id);
    } catch (e) {
      if (e.status !== 404) { status('Delete failed: ' + e.message, true); return; }
    }
    store.del(transcriptKey(id));
    if (state.session && state.session.id === id) {
      state.session = null;
      store.del(CURRENT);
      renderLog();
      showSession();
    }
    status('Deleted session ' + id.slice(0, 8) + '.');
    await refreshList();
    $('new-chat').focus();
  }

  async function exportSession(id) {
    try {
      const r = await api('GET', '/v1/sessions/' + id + '/state');
      const blob = await r.blob();
      const url = URL.createObjectURL(blob);
      const a = el('a', { href: url, download: id + '.dsst', class: 'sr-only' });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      status('Exported ' + fmtBytes(blob.size) + ' as ' + id + '.dsst.');
    } catch (e) {
      status('Export failed: ' + e.message, true);
    }
  }

  /* Import: a new empty session whose state is replaced by the file. */
  async function importFile(file) {
    let s;
    try {
      s = await apiJson('POST', '/v1/sessions', { json: {} });
      await api('PUT', '/v1/sessions/' + s.id + '/state',
        { body: file, headers: { 'Content-Type': 'application/octet-stream' } });
    } catch (e) {
      status('Import failed: ' + e.message, true);
      if (s) api('DELETE', '/v1/sessions/' + s.id).catch(() => {});
      return;
    }
    saveTranscript(s.id, { system: null, turns: [], note: 'Imported from ' + file.name +
      ': the state continues the exported conversation, whose text is not part of a state.' });
    status('Imported ' + file.name + ' into session ' + s.id.slice(0, 8) + '.');
    await refreshList();
    await openSession(s.id);
  }

  // ---- settings ----
  const FIELDS = ['system', 'temperature', 'top_p', 'max_tokens', 'seed', 'extra'];
  function loadSettings() {
    let saved = {};
    try { saved = JSON.parse(store.get(SETTINGS) || '{}') || {}; } catch (e) { saved = {}; }
    for (const f of FIELDS) if (typeof saved[f] === 'string') $(f).value = saved[f];
  }
  function saveSettings() {
    const o = {};
    for (const f of FIELDS) o[f] = $(f).value;
    store.set(SETTINGS, JSON.stringify(o));
  }
  /* The generate request's sampling fields; throws with a message naming
   * the setting that is wrong. */
  function genParams() {
    const p = {};
    const num = (id, name, integer) => {
      const v = $(id).value.trim();
      if (v === '') return;
      const x = Number(v);
      if (!Number.isFinite(x) || (integer && !Number.isInteger(x))) {
        throw new Error(name + ' must be ' + (integer ? 'an integer' : 'a number') + '.');
      }
      p[id] = x;
    };
    num('temperature', 'Temperature', false);
    num('top_p', 'Top-p', false);
    num('max_tokens', 'Max tokens', true);
    num('seed', 'Seed', true);
    const extra = $('extra').value.trim();
    if (extra) {
      let x;
      try { x = JSON.parse(extra); } catch (e) { throw new Error('Extra request fields: ' + e.message); }
      if (!x || typeof x !== 'object' || Array.isArray(x)) {
        throw new Error('Extra request fields must be a JSON object.');
      }
      Object.assign(p, x);
    }
    p.stream = true;
    p.stream_format = 'sse';
    return p;
  }

  // ---- streaming a reply ----
  async function* sseData(response) {
    const reader = response.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true }).replace(/\r\n/g, '\n');
      let cut;
      while ((cut = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const data = block.split('\n').filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
        if (data) yield data; // comments (": ping") carry no data
      }
    }
  }

  /* POSTs body to path and streams the reply into the message art.
   * Returns {text, tokens, stopped, refused, error, finish, session}. */
  async function streamReply(path, body, art) {
    const ctrl = new AbortController();
    state.controller = ctrl;
    setBusy(true);
    art.setAttribute('aria-busy', 'true');
    const res = { text: '', tokens: 0, stopped: false, refused: false, error: null, finish: null,
                  session: null };
    const t0 = performance.now();
    let tFirst = null;
    let tLast = null;
    let pending = false;
    const log = $('log');
    const paint = () => {
      pending = false;
      const stick = log.scrollHeight - log.scrollTop - log.clientHeight < 60;
      setMessageText(art, res.text);
      if (stick) log.scrollTop = log.scrollHeight;
    };
    let r = null;
    try {
      // a session that just stopped may still be finishing its last step
      for (let tries = 0; ; tries++) {
        try {
          r = await api('POST', path, { json: body, signal: ctrl.signal });
          break;
        } catch (e) {
          if (e instanceof ApiError && e.code === 'session_busy' && tries < 10) {
            await sleep(300);
            continue;
          }
          throw e;
        }
      }
      for await (const data of sseData(r)) {
        if (data === '[DONE]') break;
        const ev = JSON.parse(data);
        if (ev.error) { res.error = ev.error.message || 'the generation failed'; continue; }
        if (ev.done) {
          res.finish = ev.finish_reason || null;
          res.session = ev.session || null;
          continue;
        }
        if (typeof ev.text === 'string') {
          const now = performance.now();
          if (tFirst === null) tFirst = now;
          tLast = now;
          if (ev.token >= 0) res.tokens++;
          res.text += ev.text;
          if (!pending) { pending = true; requestAnimationFrame(paint); }
        }
      }
    } catch (e) {
      if (e.name === 'AbortError') res.stopped = true;
      else {
        res.error = e.message;
        res.refused = r === null && e instanceof ApiError;
      }
    } finally {
      state.controller = null;
    }
    paint();
    art.setAttribute('aria-busy', 'false');
    const ttft = tFirst === null ? null : tFirst - t0;
    $('m-ttft').textContent = ttft === null ? '–' : Math.round(ttft) + ' ms';
    const span = tFirst === null ? 0 : (tLast - tFirst) / 1000;
    $('m-tps').textContent = res.tokens > 1 && span > 0 ? ((res.tokens - 1) / span).toFixed(1) : '–';
    $('m-tokens').textContent = String(res.tokens);
    setBusy(false);
    return res;
  }

  /* The reply's outcome into the turn (and the transcript t of session id). */
  function finishTurn(res, turn, art, id, t) {
    turn.assistant = res.text;
    turn.stopped = res.stopped;
    turn.finish = res.finish;
    turn.error = res.error;
    const [st, err] = turnStatus(turn);
    setMessageStatus(art, st, err);
    status(res.error ? 'Error: ' + res.error : res.stopped ? 'Stopped.' : 'Reply complete.', !!res.error);
    saveTranscript(id, t);
  }

  /* The session as the reply left it, in the panels. */
  async function showReplySession(res) {
    if (res.session) { state.session = res.session; showSession(); } else await reloadSession();
    refreshList();
  }

  async function ensureSession() {
    if (state.session) return state.session;
    const system = $('system').value.trim();
    const s = await apiJson('POST', '/v1/sessions', { json: system ? { system } : {} });
    saveTranscript(s.id, { system: system || null, turns: [], note: null });
    state.session = s;
    store.set(CURRENT, s.id);
    renderLog();
    showSession();
    refreshList();
    return s;
  }

  async function send() {
    const text = $('prompt').value;
    if (!text.trim() || state.controller) return;
    let params;
    try { params = genParams(); } catch (e) { status(e.message, true); return; }
    let s;
    try { s = await ensureSession(); } catch (e) {
      status('Could not create a session: ' + e.message, true);
      return;
    }
    const t = loadTranscript(s.id);
    const turn = { user: text, assistant: '' };
    t.turns.push(turn);
    saveTranscript(s.id, t);
    $('prompt').value = '';
    const log = $('log');
    log.append(messageEl('user', text));
    const art = messageEl('assistant', '');
    log.append(art);
    log.scrollTop = log.scrollHeight;
    params.messages = [{ role: 'user', content: text }];
    const res = await streamReply('/v1/sessions/' + s.id + '/generate', params, art);
    if (res.refused) {
      // refused before it started: not a turn of the session
      t.turns.pop();
      saveTranscript(s.id, t);
      art.previousSibling.remove();
      art.remove();
      $('prompt').value = text;
      status('Not sent: ' + res.error, true);
    } else {
      finishTurn(res, turn, art, s.id, t);
    }
    await showReplySession(res);
    $('prompt').focus();
  }

  async function regenerate() {
    const s = state.session;
    if (!s || state.controller) return;
    let params;
    try { params = genParams(); } catch (e) { status(e.message, true); return; }
    const t = loadTranscript(s.id);
    let turn = t.turns[t.turns.length - 1];
    const arts = $('log').querySelectorAll('.msg-assistant');
    let art = arts[arts.length - 1];
    if (!turn || !art) {
      // history unknown here: show the new reply on its own
      turn = { user: null, assistant: '' };
      t.turns.push(turn);
      art = messageEl('assistant', '');
      $('log').append(art);
    }
    setMessageText(art, '');
    setMessageStatus(art, '');
    const res = await streamReply('/v1/sessions/' + s.id + '/regenerate', params, art);
    if (res.refused) {
      setMessageText(art, turn.assistant || '');
      status('Could not regenerate: ' + res.error, true);
    } else {
      finishTurn(res, turn, art, s.id, t);
    }
    await showReplySession(res);
  }

  async function rollback() {
    const s = state.session;
    if (!s || state.controller) return;
    try {
      state.session = await apiJson('POST', '/v1/sessions/' + s.id + '/rollback', { json: { turns: 1 } });
    } catch (e) {
      status('Rollback failed: ' + e.message, true);
      return;
    }
    const t = loadTranscript(s.id);
    const undone = t.turns.pop();
    saveTranscript(s.id, t);
    if (undone && undone.user && !$('prompt').value) $('prompt').value = undone.user;
    renderLog();
    showSession();
    refreshList();
    status('Rolled back one turn.');
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  function newChat() {
    if (state.controller) return;
    state.session = null;
    store.del(CURRENT);
    renderLog();
    showSession();
    markCurrent();
    $('prompt').focus();
  }

  // ---- server status ----
  async function pollHealth() {
    for (;;) {
      try {
        const r = await fetch('/health', { cache: 'no-store' });
        const h = await r.json();
        if (h.status === 'ok') { $('model').textContent = h.model || 'model loaded'; return; }
        $('model').textContent = 'server ' + h.status + '…';
      } catch (e) {
        $('model').textContent = 'server unreachable';
      }
      await sleep(2000);
    }
  }

  // ---- wiring ----
  function init() {
    loadSettings();
    for (const f of FIELDS) $(f).addEventListener('change', saveSettings);
    $('composer').addEventListener('submit', (e) => { e.preventDefault(); send(); });
    $('prompt').addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        send();
      }
    });
    document.addEventListener('keydown', (e) => {
      if (e.key === 'Escape' && state.controller) { e.preventDefault(); stop(); }
    });
    $('stop').addEventListener('click', stop);
    $('regen').addEventListener('click', regenerate);
    $('rollback').addEventListener('click', rollback);
    $('new-chat').addEventListener('click', newChat);
    $('refresh').addEventListener('click', refreshList);
    $('import-file').addEventListener('change', () => {
      const f = $('import-file').files[0];
      $('import-file').value = '';
      if (f) importFile(f);
    });
    $('key-btn').addEventListener('click', async () => {
      if (await askKey('')) refreshList();
    });
    $('key-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const k = $('key-input').value.trim();
      if (k) store.set(KEY, k); else store.del(KEY);
      closeKey(!!k);
    });
    $('key-forget').addEventListener('click', () => { store.del(KEY); closeKey(false); });
    $('key-cancel').addEventListener('click', () => closeKey(false));
    $('key-dialog').addEventListener('cancel', (e) => { e.preventDefault(); closeKey(false); });

    showSession();
    pollHealth().then(async () => {
      await refreshList();
      const cur = store.get(CURRENT);
      if (cur && state.sessions.some((s) => s.id === cur)) await openSession(cur);
    });
  }

  init();
}());
