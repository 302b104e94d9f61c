(() => {
'use strict';
const D = window.zergDashboard = { lastStatus: null, selected: null, events: [] };
const $ = id => document.getElementById(id);
const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
const esc = v => String(v ?? '').replace(/[&<>"']/g, c => ESC[c]);
const cls = v => String(v ?? '').toLowerCase().replace(/[^a-z0-9_]/g, '');
const txt = v => (v !== null && typeof v === 'object') ? JSON.stringify(v) : String(v ?? '');
const q = o => new URLSearchParams(o).toString();
const TERMINAL = ['complete', 'failed', 'stopped'];
const TASK_STATES = ['pending', 'in_progress', 'waiting_retry', 'complete', 'failed', 'blocked', 'paused'];
const DEAD = ['exited', 'done', 'gave_up'];

// The session is a cookie the page cannot read: no secret lives in the page or its URLs.
const expired = new URLSearchParams(location.search).has('expired');
if (location.search) history.replaceState(null, '', '/' + location.hash);
let info = null, started = false, authWait = false, rushes = [], es = null;
let receivedAt = 0, offset = 0, confirming = false, busy = false;
let selTask = null, selTaskState = null, logKey = '', logSeq = 0, logInflight = 0;
// The log as read so far, per file: its lines (the last LOG_KEEP) and the offset read up to.
const LOG_KEEP = 5000;
let logFiles = new Map(), logTask = '';
const timers = {};
const cache = new Map();
function setHTML(el, html) { if (cache.get(el) !== html) { cache.set(el, html); el.innerHTML = html; } }

// ---------- formatting ----------
function fmtUsd(v) { return (v === null || v === undefined || v === '' || isNaN(v)) ? '—' : '$' + Number(v).toFixed(2); }
function fmtTok(n) {
  if (n === null || n === undefined || isNaN(n)) return '—';
  n = Number(n);
  for (const [d, s] of [[1e9, 'B'], [1e6, 'M'], [1e3, 'k']]) {
    if (n >= d) { const v = n / d; return (v >= 100 ? v.toFixed(0) : v.toFixed(1).replace(/\.0$/, '')) + s; }
  }
  return String(n);
}
const tokSum = t => t ? (t.input || 0) + (t.output || 0) + (t.cache_read || 0) + (t.cache_creation || 0) : null;
function fmtDur(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return s + 's';
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  return `${Math.floor(m / 60)}h ${m % 60}m`;
}
function fmtClock(v) {
  const d = new Date(v);
  if (!v || isNaN(d)) return txt(v);
  return d.toDateString() === new Date().toDateString() ? d.toLocaleTimeString() : d.toLocaleString();
}
const shortRepo = r => String(r || '').replace(/\/+$/, '').split('/').slice(-2).join('/');
const badge = s => `<span class="badge s-${cls(s)}">${esc(String(s || '?').replace(/_/g, ' '))}</span>`;
const pct = (a, b) => b ? Math.max(0, Math.min(100, 100 * a / b || 0)) : 0;

// ---------- errors, api, auth ----------
function showError(msg) { $('error-text').textContent = msg; $('error').hidden = false; }
$('error-close').addEventListener('click', () => { $('error').hidden = true; });

async function api(path, body) {
  const headers = {};
  const opts = { headers, cache: 'no-store', credentials: 'same-origin' };
  if (body !== undefined) { opts.method = 'POST'; headers['Content-Type'] = 'application/json'; opts.body = JSON.stringify(body); }
  const res = await fetch(path, opts);
  let data = null;
  try { data = await res.json(); } catch (_) { /* not JSON */ }
  if (!res.ok) {
    if (res.status === 401) askToken(started ? 'The session has ended; open the dashboard again.' : '');
    throw new Error((data && data.error) || `${res.status} ${res.statusText}`);
  }
  return data;
}

function askToken(msg) {
  authWait = true;
  if (es) { es.close(); es = null; }
  setLive(null);
  $('token-msg').textContent = msg || '';
  $('token-form').hidden = false;
  $('token-input').focus();
}
$('token-form').addEventListener('submit', e => {
  e.preventDefault();
  const t = $('token-input').value.trim();
  if (!t) return;
  $('token-input').value = '';
  fetch('/api/session', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ token: t }), credentials: 'same-origin' })
    .then(res => {
      if (!res.ok) { $('token-msg').textContent = 'That token was refused.'; return; }
      authWait = false; $('token-form').hidden = true;
      if (!started) boot(); else { pollRushes(); if (D.selected) { connect(); loadStatus(); } }
    })
    .catch(err => { $('token-msg').textContent = 'Cannot reach zergd: ' + err.message; });
});

function setLive(on) {
  const el = $('live');
  el.className = on === null ? '' : on ? 'on' : 'off';
  el.textContent = on === null ? '' : on ? 'live' : 'reconnecting…';
}

// ---------- rush list ----------
function levelBar(r) {
  const lv = Array.isArray(r.levels) ? r.levels : [];
  if (!lv.length) return `<div class="bar"><span class="seg s-${cls(r.state)}"><i style="width:${pct(r.tasks_complete, r.tasks_total).toFixed(1)}%"></i></span></div>`;
  return '<div class="bar">' + lv.map(l =>
    `<span class="seg s-${cls(l.state)}" title="Level ${esc(l.level)}: ${esc(l.complete)}/${esc(l.tasks)} (${esc(l.state)}, merge ${esc(l.merge)})"><i style="width:${pct(l.complete, l.tasks).toFixed(1)}%"></i></span>`).join('') + '</div>';
}
function renderRushes() {
  const sel = D.selected;
  const html = rushes.length ? rushes.map(r => {
    const on = sel && sel.repo === r.repo && sel.feature === r.feature;
    const tok = tokSum(r.tokens);
    return `<div class="rrow${on ? ' sel' : ''}" data-rush="${esc(r.feature)}" data-repo="${esc(r.repo)}" tabindex="0" role="button" title="${esc(r.repo)}${r.started_at ? '\nstarted ' + esc(fmtClock(r.started_at)) : ''}">
<div class="rtop"><span class="feat">${esc(r.feature)}</span>${badge(r.state)}</div>
<div class="rsub">${esc(shortRepo(r.repo))}</div>${levelBar(r)}
<div class="rsub"><span>${esc(r.tasks_complete ?? 0)}/${esc(r.tasks_total ?? 0)} tasks</span><span>${fmtUsd(r.cost_usd)}</span><span>${tok === null ? '—' : fmtTok(tok) + ' tok'}</span></div></div>`;
  }).join('') : '<div class="empty">No rushes yet.</div>';
  setHTML($('rushes'), html);
}
function pickRush(e) {
  const row = e.target.closest('[data-rush]');
  if (row) select(row.dataset.repo, row.dataset.rush);
}
$('rushes').addEventListener('click', pickRush);
$('rushes').addEventListener('keydown', e => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); pickRush(e); } });

async function pollRushes() {
  if (authWait) return;
  try {
    const d = await api('/api/rushes');
    rushes = (d && d.rushes) || [];
    renderRushes();
    if (!D.selected && rushes.length) {
      const r = rushes.find(x => x.state === 'running') || rushes[0];
      select(r.repo, r.feature);
    }
  } catch (e) { showError('Rushes: ' + e.message); }
}

// ---------- selection & live stream ----------
function fromHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  const repo = p.get('repo'), feature = p.get('feature');
  return repo && feature ? { repo, feature } : null;
}
window.addEventListener('hashchange', () => { const h = fromHash(); if (h) select(h.repo, h.feature); });

function select(repo, feature) {
  const cur = D.selected;
  if (cur && cur.repo === repo && cur.feature === feature) return;
  D.selected = { repo, feature };
  D.lastStatus = null; D.events.length = 0;
  selTask = null; selTaskState = null; logKey = ''; confirming = false;
  history.replaceState(null, '', location.pathname + location.search + '#' + q({ repo, feature }));
  renderRushes(); renderEvents();
  $('rush-body').hidden = true; $('rush-placeholder').hidden = false;
  $('rush-placeholder').textContent = 'Loading ' + feature + '…';
  connect(); loadStatus();
}
function loadStatus() {
  const want = D.selected;
  if (!want || authWait) return;
  api('/api/rush?' + q(want))
    .then(s => { if (D.selected === want && !D.lastStatus) onStatus(s); })
    .catch(e => { if (D.selected === want) { showError('Rush ' + want.feature + ': ' + e.message); if (!D.lastStatus) $('rush-placeholder').textContent = 'Could not load ' + want.feature + '.'; } });
}
function connect() {
  if (es) { es.close(); es = null; }
  if (!D.selected || authWait) return;
  const p = { repo: D.selected.repo, feature: D.selected.feature };
  const src = es = new EventSource('/api/watch?' + q(p));
  src.addEventListener('open', () => { if (es === src) setLive(true); });
  src.addEventListener('status', e => {
    if (es !== src) return;
    let s; try { s = JSON.parse(e.data); } catch (err) { showError('Bad status event: ' + err.message); return; }
    setLive(true); onStatus(s);
  });
  src.addEventListener('message', e => {
    if (es !== src) return;
    try { pushEvent(JSON.parse(e.data)); } catch (_) { /* ignore malformed */ }
  });
  src.addEventListener('end', () => {   // the rush has ended: nothing more will come
    if (es !== src) return;
    src.close(); es = null; setLive(false);
  });
  src.addEventListener('error', () => {
    if (es !== src) return;
    setLive(false);
    if (src.readyState === EventSource.CLOSED) {   // browser gave up: retry ourselves
      es = null;
      setTimeout(() => { if (!es && !authWait && D.selected) { connect(); loadStatus(); } }, 5000);
    }
  });
}

function onStatus(s) {
  if (!s || typeof s !== 'object') return;
  D.lastStatus = s; receivedAt = Date.now();
  const n = Date.parse(s.now); offset = isNaN(n) ? 0 : n - receivedAt;
  if (TERMINAL.includes(s.state)) confirming = false;
  $('rush-placeholder').hidden = true; $('rush-body').hidden = false;
  renderDetail();
  // The list's row of this rush follows its status at once, not at the next poll.
  const row = rushes.find(r => r.repo === s.repo && r.feature === s.feature);
  if (row) {
    Object.assign(row, { state: s.state, cost_usd: s.cost_usd, tokens: s.tokens, levels: s.levels,
      tasks_total: (s.tasks || []).length, tasks_complete: (s.tasks || []).filter(t => t.state === 'complete').length });
    renderRushes();
  }
  if (selTask) {
    const t = findTask(selTask), st = t ? t.state : null;
    if (st !== selTaskState) { selTaskState = st; loadLog(); }
  }
}
function pushEvent(ev) {
  if (!ev || typeof ev !== 'object') return;
  ev.received_at = new Date().toISOString();
  D.events.unshift(ev);
  if (D.events.length > 50) D.events.length = 50;
  renderEvents();
}
const findTask = id => ((D.lastStatus && D.lastStatus.tasks) || []).find(t => t.id === id) || null;

// ---------- detail ----------
function renderDetail() { renderHead(); renderActions(); renderGraph(); renderWorkers(); renderEsc(); renderLogHead(); tick(); }

function renderHead() {
  const s = D.lastStatus, tasks = s.tasks || [], tok = s.tokens;
  const done = tasks.filter(t => t.state === 'complete').length;
  let h = `<div class="title"><h2>${esc(s.feature)}</h2>${badge(s.state)}${s.mode ? `<span class="badge">${esc(s.mode)}</span>` : ''}</div>
<div class="meta"><span title="${esc(s.repo)}">${esc(shortRepo(s.repo))}</span> · Level <b>${esc(s.current_level ?? '?')}</b> of <b>${esc(s.total_levels ?? '?')}</b> · <b>${done}</b>/${tasks.length} tasks complete`;
  const st = Date.parse(s.started_at), en = Date.parse(s.finished_at);
  if (!isNaN(st)) h += ` · <span id="elapsed" data-start="${st}" data-end="${isNaN(en) ? '' : en}"></span>`;
  if (s.staging_branch || s.base_branch) h += ` · <span class="mono">${esc(s.staging_branch || '?')} → ${esc(s.base_branch || '?')}</span>`;
  h += '</div><div class="meta">Cost <b>' + fmtUsd(s.cost_usd) + '</b>';
  if (s.max_usd) { const p = pct(s.cost_usd, s.max_usd); h += ` / ${fmtUsd(s.max_usd)} budget <span class="mini${p >= 90 ? ' over' : ''}"><i style="width:${p.toFixed(1)}%"></i></span>`; }
  h += tok ? ` · Tokens <b>${fmtTok(tokSum(tok))}</b> (in ${fmtTok(tok.input || 0)}, out ${fmtTok(tok.output || 0)}, cache read ${fmtTok(tok.cache_read || 0)}, cache write ${fmtTok(tok.cache_creation || 0)})` : ' · Tokens —';
  h += '</div>';
  const models = Object.entries(s.models || {});
  if (models.length) h += '<div class="meta small">' + models.map(([m, v]) => `<span class="mono">${esc(m)}</span> ${fmtUsd(v && v.cost_usd)} / ${fmtTok(tokSum(v && v.tokens))} tok`).join(' · ') + '</div>';
  if (s.rate_limited_until) {
    const u = Date.parse(s.rate_limited_until);
    h += `<div class="hold">Rate-limit hold${s.rate_limit_type ? ' (' + esc(s.rate_limit_type) + ')' : ''} until ${esc(fmtClock(s.rate_limited_until))}${isNaN(u) ? '' : ` — <span id="rl-left" data-until="${u}"></span>`}</div>`;
  }
  if (s.reason) h += `<div class="reason">Reason: ${esc(s.reason)}</div>`;
  if (s.sandbox) h += `<div class="${s.sandbox.confined ? 'sandbox' : 'reason'}">Sandbox: ${esc(s.sandbox.summary)}${s.sandbox.egress_refused ? ' · egress refused: ' + esc(String(s.sandbox.egress_refused)) : ''}</div>`;
  const r = s.resilience || {};
  h += `<div class="meta small">Resilience: spawn retries ${esc(r.spawn_retries ?? 0)} · stale detections ${esc(r.stale_detections ?? 0)} · reassignments ${esc(r.task_reassignments ?? 0)} · respawns ${esc(r.worker_respawns ?? 0)} · reconcile fixes ${esc(r.reconcile_fixes ?? 0)} · warnings ${esc(s.warnings ?? 0)}</div>`;
  setHTML($('rush-head'), h);
}

function renderActions() {
  const s = D.lastStatus;
  if (!s) return;
  const term = TERMINAL.includes(s.state), dis = busy ? ' disabled' : '';
  const retry = (s.tasks || []).some(t => t.state === 'failed' || t.state === 'blocked') || ['failed', 'stopped', 'paused'].includes(s.state);
  let h = confirming && !term
    ? `<button id="stop-confirm" class="danger"${dis}>Confirm stop</button><button id="stop-cancel">Cancel</button>`
    : `<button id="stop" class="warn"${term || busy ? ' disabled' : ''}>Stop</button>`;
  if (retry) h += `<button id="retry"${dis}>Retry failed</button>`;
  setHTML($('actions-buttons'), h);
}
const requeued = d => { const n = ((d && d.requeued) || []).length; return n ? `requeued ${n} task${n === 1 ? '' : 's'}` : 'nothing to requeue'; };
$('actions').addEventListener('click', e => {
  const b = e.target.closest('button');
  if (!b || b.disabled || !D.selected) return;
  const { repo, feature } = D.selected;
  if (b.id === 'stop') { confirming = true; renderActions(); const c = $('stop-confirm'); if (c) c.focus(); }
  else if (b.id === 'stop-cancel') { confirming = false; renderActions(); }
  else if (b.id === 'stop-confirm') {
    confirming = false;
    post('/api/stop', { repo, feature, force: false }, d => { const n = (d && d.workers_signalled) || 0; return `${n} worker${n === 1 ? '' : 's'} signalled`; }, 'action-result');
  } else if (b.id === 'retry') post('/api/retry', { repo, feature, task_ids: [], reset: false }, requeued, 'action-result');
});
async function post(path, body, msg, where) {
  busy = true; renderActions(); renderLogHead();
  let text = '';
  try { text = msg(await api(path, body)); } catch (e) { showError(e.message); }
  busy = false;
  // A retried rush that had ended runs again: follow it anew.
  if (path === '/api/retry' && !es && D.selected) { connect(); loadStatus(); }
  if (D.lastStatus) { renderActions(); renderLogHead(); }
  if (text) flash(where, text);
}
function flash(id, text) {
  const el = $(id); if (!el) return;
  el.textContent = text;
  clearTimeout(timers[id]);
  timers[id] = setTimeout(() => { const x = $(id); if (x) x.textContent = ''; }, 8000);
}

// ---------- graph ----------
$('legend').innerHTML = TASK_STATES.map(s => `<span><i class="sw s-${s}"></i>${s.replace(/_/g, ' ')}</span>`).join('');
function taskBox(t) {
  const tip = [t.id, t.title, 'state: ' + t.state, t.worker != null && 'worker ' + t.worker, t.attempts > 1 && 'attempts: ' + t.attempts, (t.attempt_models || []).length && 'models: ' + t.attempt_models.join(', '),
    t.error && 'error: ' + txt(t.error), t.blocked_by && t.blocked_by.length && 'blocked by: ' + t.blocked_by.join(', ')].filter(Boolean).join('\n');
  return `<div class="task s-${cls(t.state)}${t.id === selTask ? ' sel' : ''}" data-task="${esc(t.id)}" data-state="${esc(t.state)}" title="${esc(tip)}" tabindex="0">`
    + `<div class="tl"><span class="tid">${esc(t.id)}</span>${t.worker != null ? `<span class="tw">w${esc(t.worker)}</span>` : ''}${Number(t.attempts) > 1 ? `<span class="ta">×${esc(t.attempts)}</span>` : ''}</div>`
    + `<div class="tt">${esc(t.title)}</div></div>`;
}
function renderGraph() {
  const s = D.lastStatus, by = new Map();
  for (const l of s.levels || []) by.set(l.level, { l, tasks: [] });
  for (const t of s.tasks || []) {
    if (!by.has(t.level)) by.set(t.level, { l: null, tasks: [] });
    by.get(t.level).tasks.push(t);
  }
  const keys = [...by.keys()].sort((a, b) => a - b);
  const html = keys.length ? keys.map(k => {
    const { l, tasks } = by.get(k);
    const total = l ? l.tasks : tasks.length, done = l ? l.complete : tasks.filter(t => t.state === 'complete').length;
    const conf = l && l.conflicts && l.conflicts.length ? `<div class="conf" title="merge conflicts">⚠ ${l.conflicts.map(esc).join('<br>')}</div>` : '';
    return `<div class="level${s.current_level === k ? ' cur' : ''}" data-level="${esc(k)}"><div class="lhead">`
      + `<div><b>Level ${esc(k)}</b>${l ? badge(l.state) : ''}<span class="muted small" style="margin-left:auto">${esc(done)}/${esc(total)}</span></div>`
      + `<div class="small muted">merge ${l ? badge(l.merge) : '—'}${l && l.merge_commit ? ` <span class="mono" title="${esc(l.merge_commit)}">${esc(String(l.merge_commit).slice(0, 8))}</span>` : ''}</div>${conf}</div>`
      + tasks.map(taskBox).join('') + '</div>';
  }).join('') : '<div class="empty">No tasks yet.</div>';
  setHTML($('graph'), html);
}
function pickTask(e) { const el = e.target.closest('[data-task]'); if (el) selectTask(el.dataset.task); }
$('graph').addEventListener('click', pickTask);
$('graph').addEventListener('keydown', e => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); pickTask(e); } });
function selectTask(id) {
  selTask = id; logKey = '';
  const t = findTask(id); selTaskState = t ? t.state : null;
  setHTML($('log-body'), '<div class="empty">Loading…</div>');
  renderGraph(); renderLogHead(); loadLog();
}

// ---------- workers ----------
function renderWorkers() {
  const ws = D.lastStatus.workers || [];
  if (!ws.length) { setHTML($('workers'), '<div class="empty">No workers.</div>'); return; }
  const rows = ws.map(w => {
    let at = '';
    if (w.heartbeat_age_ms !== null && w.heartbeat_age_ms !== undefined) at = receivedAt - Number(w.heartbeat_age_ms);
    else if (w.last_heartbeat) { const p = Date.parse(w.last_heartbeat); if (!isNaN(p)) at = p - offset; }
    const has = w.progress_pct !== null && w.progress_pct !== undefined && w.progress_pct !== '';
    const p = has ? pct(Number(w.progress_pct), 100) : 0;
    const step = w.step ? `${esc(String(w.step).replace(/_/g, ' '))}${has ? ` <span class="mini"><i style="width:${p}%"></i></span> ${Math.round(p)}%` : ''}` : '<span class="muted">—</span>';
    const det = [w.detail, w.reason && 'reason: ' + txt(w.reason), w.last_exit != null && w.last_exit !== '' && 'last exit: ' + txt(w.last_exit)].filter(Boolean).map(txt).join(' · ');
    return `<tr data-worker="${esc(w.id)}" class="${DEAD.includes(w.state) ? 'dead' : ''}"><td>${esc(w.id)}</td><td>${badge(w.state)}</td>`
      + `<td>${w.task ? `<span class="link" data-goto="${esc(w.task)}">${esc(w.task)}</span>` : '<span class="muted">—</span>'}</td><td>${step}</td>`
      + `<td class="hb" data-hb-at="${at}"></td><td>${esc(w.respawns ?? 0)}</td><td>${esc(w.tasks_completed ?? 0)}</td><td class="det" title="${esc(det)}">${esc(det)}</td></tr>`;
  }).join('');
  setHTML($('workers'), `<table><thead><tr><th>#</th><th>State</th><th>Task</th><th>Step</th><th>Heartbeat</th><th>Respawns</th><th>Done</th><th>Detail</th></tr></thead><tbody>${rows}</tbody></table>`);
}
$('workers').addEventListener('click', e => {
  const el = e.target.closest('[data-goto]'); if (!el) return;
  selectTask(el.dataset.goto);
  const box = document.querySelector(`#graph [data-task="${CSS.escape(el.dataset.goto)}"]`);
  if (box) box.scrollIntoView({ block: 'nearest', inline: 'nearest' });
});

// ---------- escalations ----------
function renderEsc() {
  const list = (D.lastStatus.escalations || []).slice()
    .sort((a, b) => (Date.parse(b.timestamp) || 0) - (Date.parse(a.timestamp) || 0))
    .sort((a, b) => (a.resolved ? 1 : 0) - (b.resolved ? 1 : 0));
  const open = list.filter(e => !e.resolved).length;
  $('esc-count').textContent = list.length ? `${open} open / ${list.length}` : '';
  $('escalations').classList.toggle('alert', open > 0);
  setHTML($('esc-list'), list.length ? list.map(e => `<div class="esc${e.resolved ? ' resolved' : ''}"><div class="small muted">${e.resolved ? 'resolved' : '<b style="color:#fca5a5">OPEN</b>'} · worker ${esc(e.worker)} · <span class="mono">${esc(e.task)}</span> · ${esc(e.category)} · ${esc(fmtClock(e.timestamp))}</div><div>${esc(e.message)}</div></div>`).join('')
    : '<div class="empty">No escalations.</div>');
}

// ---------- log ----------
function renderLogHead() {
  if (!selTask) { renderNotes(null); setHTML($('log-head'), '<h3>Log</h3><div class="muted">Click a task to see its log.</div>'); setHTML($('log-body'), ''); return; }
  const t = findTask(selTask) || { id: selTask };
  const bits = [t.worker != null && 'worker ' + esc(t.worker), t.attempts != null && 'attempts ' + esc(t.attempts), (t.attempt_models || []).length && 'models ' + esc(t.attempt_models.join(', ')), t.crashes && 'crashes ' + esc(t.crashes),
    t.duration_ms != null && 'took ' + fmtDur(t.duration_ms), t.cost_usd != null && fmtUsd(t.cost_usd),
    t.commit && `commit <span class="mono">${esc(String(t.commit).slice(0, 10))}</span>`,
    t.blocked_by && t.blocked_by.length && 'blocked by ' + t.blocked_by.map(esc).join(', ')].filter(Boolean).join(' · ');
  const can = !busy && t.state !== 'in_progress';
  renderNotes(t);
  setHTML($('log-head'), `<div class="lh"><h3>Log — <span class="mono">${esc(selTask)}</span></h3>${t.state ? badge(t.state) : ''}<button id="retry-task"${can ? '' : ' disabled'}>Retry this task</button></div>`
    + `<div class="small">${esc(t.title || '')}</div><div class="small muted">${bits}</div>${t.error ? `<div class="err small">${esc(txt(t.error))}</div>` : ''}`);
}
// The note box is its own element, so that a status update does not wipe what is being typed.
function renderNotes(t) {
  const box = $('note-box');
  box.hidden = !selTask || !t || t.state === 'complete';
  $('note-list').replaceChildren(...(t && t.notes || []).map(n => { const d = document.createElement('div'); d.textContent = n; return d; }));
}
$('note-box').addEventListener('submit', e => {
  e.preventDefault();
  const text = $('note-text').value.trim();
  if (!text || !selTask || !D.selected) return;
  post('/api/note', { repo: D.selected.repo, feature: D.selected.feature, task_id: selTask, text, restart: $('note-restart').checked },
    d => { $('note-text').value = ''; $('note-restart').checked = false; return `Note added (${d.notes} in all): ${d.outcome}`; }, 'log-result');
});
$('log-head').addEventListener('click', e => {
  const b = e.target.closest('#retry-task');
  if (!b || b.disabled || !selTask || !D.selected) return;
  post('/api/retry', { repo: D.selected.repo, feature: D.selected.feature, task_ids: [selTask], reset: false }, requeued, 'log-result');
});
async function loadLog(fromTimer) {
  if (!selTask || !D.selected || authWait || (fromTimer && logInflight)) return;
  const id = selTask, want = D.selected, seq = ++logSeq;
  logInflight++;
  try {
    const key = want.repo + '\n' + want.feature + '\n' + id;
    if (key !== logTask) { logTask = key; logFiles = new Map(); }
    const p = new URLSearchParams({ repo: want.repo, feature: want.feature, task: id });
    for (const [name, f] of logFiles) p.append('at', name + ':' + f.end);
    const d = await api('/api/log?' + p.toString());
    if (seq === logSeq && id === selTask && want === D.selected && key === logTask) { mergeLog(d); renderLogBody(); }
  } catch (e) {
    if (seq === logSeq && id === selTask) { logKey = ''; setHTML($('log-body'), `<div class="empty err">Could not load log: ${esc(e.message)}</div>`); showError('Log ' + id + ': ' + e.message); }
  } finally { logInflight--; }
}
// What is new in each file is added to what the page holds; a file read again from its end
// (it shrank, or more than the cap came since) starts over.
function mergeLog(d) {
  for (const f of (d && d.files) || []) {
    const had = logFiles.get(f.name);
    const lines = (had && had.end === f.start && !f.skipped) ? had.lines.concat(f.lines || []) : (f.lines || []);
    logFiles.set(f.name, { name: f.name, end: f.end, lines: lines.slice(-LOG_KEEP), truncated: (had && had.truncated) || f.truncated || f.start > 0 });
  }
}
function renderLogBody() {
  const files = [...logFiles.values()], key = JSON.stringify(files.map(f => [f.name, f.end, f.lines.length]));
  if (key === logKey) return;
  logKey = key;
  const body = $('log-body'), atEnd = {};
  body.querySelectorAll('pre[data-file]').forEach(p => { atEnd[p.dataset.file] = p.scrollHeight - p.scrollTop - p.clientHeight < 24; });
  setHTML(body, files.length ? files.map(f => `<div class="fname">${esc(f.name)}${f.truncated ? ' <span class="muted">(last lines)</span>' : ''}</div><pre data-file="${esc(f.name)}">${esc((f.lines || []).join('\n'))}</pre>`).join('')
    : '<div class="empty">No log files for this task yet.</div>');
  body.querySelectorAll('pre[data-file]').forEach(p => { if (atEnd[p.dataset.file] !== false) p.scrollTop = p.scrollHeight; });
}

// ---------- events ----------
function renderEvents() {
  setHTML($('events'), D.events.length ? D.events.map(ev => `<li class="lv-${cls(ev.level)}"><span class="time">${esc(new Date(ev.received_at).toLocaleTimeString())}</span>${ev.event ? `<span class="muted small">${esc(ev.event)}</span> ` : ''}${esc(ev.message)}</li>`).join('')
    : '<li class="empty" style="border:none">No events yet.</li>');
}

// ---------- clock ----------
function tick() {
  const now = Date.now();
  document.querySelectorAll('#workers td.hb').forEach(td => {
    const tr = td.parentElement, at = td.dataset.hbAt;
    if (at === '' || at === undefined) { td.textContent = '—'; tr.classList.remove('stale'); return; }
    const age = Math.max(0, now - Number(at));
    td.textContent = fmtDur(age) + ' ago';
    tr.classList.toggle('stale', age > 30000 && !tr.classList.contains('dead'));
  });
  const el = $('elapsed');
  if (el) { const end = el.dataset.end ? Number(el.dataset.end) : now + offset; el.textContent = (el.dataset.end ? 'ran ' : 'running ') + fmtDur(end - Number(el.dataset.start)); }
  const rl = $('rl-left');
  if (rl) { const left = Number(rl.dataset.until) - (now + offset); rl.textContent = left > 0 ? 'lifts in ' + fmtDur(left) : 'should lift now'; }
}

// ---------- boot ----------
async function boot() {
  try { info = await api('/api/info'); }
  catch (e) {
    if (authWait) { if (expired) $('token-msg').textContent = 'That link was used already or is more than a minute old: run zergctl dashboard again.'; return; }
    showError('Cannot reach zergd: ' + e.message + ' (retrying)'); setTimeout(boot, 3000); return;
  }
  $('error').hidden = true;
  const b = $('banner');
  b.textContent = info.loopback ? `Served on ${info.listen} (loopback, for zergd's owner only)`
    : `Served on ${info.listen} — reachable from the network; for zergd's owner only`;
  b.className = info.loopback ? 'ok' : 'warn';
  $('version').textContent = info.version ? 'v' + info.version : '';
  start();
}
function start() {
  if (started) return;
  started = true;
  renderEvents();
  const h = fromHash();
  if (h) select(h.repo, h.feature);
  pollRushes();
  setInterval(pollRushes, 3000);
  setInterval(tick, 1000);
  setInterval(() => { if (selTask) { const t = findTask(selTask); if (t && t.state === 'in_progress') loadLog(true); } }, 2000);
}
boot();
})();
