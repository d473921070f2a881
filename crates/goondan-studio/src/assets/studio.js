// Goondan Studio: a read-only page over `gdn studio`'s data API. Vanilla
// JavaScript, no build step: served from the gdn binary as is.
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  const state = {
    projects: [],
    instances: [],
    workspace: null,
    key: null,            // null: the whole project
    view: 'graph',
    viz: null,            // the visualization of the scope
    timeline: [],         // its timeline window (grows with live entries)
    traceId: null,
    trace: null,
    selectedEdge: null,
    live: false,
  };
  const timings = { firstPaint: null, switches: [], loads: [], live: [] };
  window.__studio = { state, timings };

  // ---- helpers -------------------------------------------------------
  const esc = (s) => String(s == null ? '' : s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
  const pad = (n, w) => String(n).padStart(w || 2, '0');
  function clock(ms) {
    const d = new Date(ms);
    return `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}.${pad(d.getUTCMilliseconds(), 3)}`;
  }
  function dur(ms) {
    if (ms == null || isNaN(ms)) return '';
    if (ms < 1) return '<1 ms';
    if (ms < 1000) return `${Math.round(ms)} ms`;
    if (ms < 60000) return `${(ms / 1000).toFixed(2)} s`;
    return `${(ms / 60000).toFixed(1)} min`;
  }
  const label = (id) => (id || '').replace(/^[^:]+:/, '');
  const kindOf = (id) => (id || '').split(':')[0];
  async function getJson(url) {
    const t0 = performance.now();
    const res = await fetch(url, { cache: 'no-store' });
    if (!res.ok) throw new Error(`HTTP ${res.status} for ${url}`);
    const body = await res.json();
    timings.loads.push({ url, ms: performance.now() - t0 });
    if (timings.loads.length > 200) timings.loads.shift();
    return body;
  }
  function debounce(fn, ms) {
    let timer = null;
    return () => { clearTimeout(timer); timer = setTimeout(fn, ms); };
  }

  // ---- routing (location.hash) ---------------------------------------
  function readHash() {
    const p = new URLSearchParams(location.hash.replace(/^#/, ''));
    state.workspace = p.get('ws') || null;
    state.key = p.get('key') || null;
    state.view = ['graph', 'flow', 'traces'].includes(p.get('view')) ? p.get('view') : 'graph';
    state.traceId = p.get('trace') || null;
  }
  function writeHash() {
    const p = new URLSearchParams();
    if (state.workspace) p.set('ws', state.workspace);
    if (state.key) p.set('key', state.key);
    p.set('view', state.view);
    if (state.traceId && state.view === 'traces') p.set('trace', state.traceId);
    history.replaceState(null, '', '#' + p.toString());
  }

  // ---- data ------------------------------------------------------------
  async function loadLists() {
    const [projects, instances] = await Promise.all([getJson('/api/projects'), getJson('/api/instances')]);
    state.projects = projects.items || [];
    state.instances = instances.items || [];
    if (!state.workspace || !state.projects.some((p) => p.id === state.workspace)) {
      const newest = [...state.projects].sort((a, b) => (b.updatedAtMs || 0) - (a.updatedAtMs || 0))[0];
      state.workspace = newest ? newest.id : null;
      state.key = null;
    }
    renderSidebar();
  }
  function vizUrl(extra) {
    const q = new URLSearchParams({ recent: '20', ...(extra || {}) });
    if (state.key != null) {
      q.set('workspace', state.workspace);
      return `/api/instances/${encodeURIComponent(state.key)}/visualization?${q}`;
    }
    return `/api/projects/${encodeURIComponent(state.workspace)}/visualization?${q}`;
  }
  async function loadViz() {
    if (!state.workspace) { state.viz = null; state.timeline = []; return; }
    const viz = await getJson(vizUrl());
    state.viz = viz;
    state.timeline = viz.timeline || [];
    state.seen = new Set(state.timeline.map((e) => e.seq));
  }
  async function loadEarlier() {
    if (!state.timeline.length) return;
    const viz = await getJson(vizUrl({ before: String(state.timeline[0].seq) }));
    const older = (viz.timeline || []).filter((e) => !state.seen.has(e.seq));
    older.forEach((e) => state.seen.add(e.seq));
    state.timeline = older.concat(state.timeline);
    state.viz.timelineStart = viz.timelineStart;
    render();
  }
  async function loadTrace() {
    state.trace = null;
    if (!state.traceId) return;
    try {
      state.trace = await getJson(`/api/traces/${encodeURIComponent(state.traceId)}?workspace=${encodeURIComponent(state.workspace)}`);
    } catch (e) {
      state.trace = null;
    }
  }

  // ---- sidebar -------------------------------------------------------
  function renderSidebar() {
    const el = $('projects');
    if (!state.projects.length) {
      el.innerHTML = '<div class="empty">No project in this state root yet. Run a swarm (<code>gdn run</code>) and it shows here.</div>';
      return;
    }
    el.innerHTML = state.projects.map((p) => {
      const keys = state.instances.filter((i) => i.workspace === p.id);
      const all = `<button type="button" class="scope-btn${p.id === state.workspace && state.key == null ? ' is-active' : ''}" data-ws="${esc(p.id)}" data-testid="scope-project">
          <div class="k"><span class="status-dot${p.serviceRunning ? ' running' : ''}"></span>All instances</div>
          <div class="m">${p.events} events · ${p.traces} traces</div></button>`;
      const items = keys.map((i) => `<button type="button" class="scope-btn${p.id === state.workspace && state.key === i.key ? ' is-active' : ''}" data-ws="${esc(p.id)}" data-key="${esc(i.key)}" data-testid="instance">
          <div class="k"><span class="status-dot${i.status === 'running' ? ' running' : ''}"></span>${esc(i.key)}</div>
          <div class="m">${esc(i.status)} · ${esc((i.agents || []).join(', '))} · ${i.events} events</div></button>`).join('');
      return `<div class="project"><div class="project-head">${esc(p.name || p.id)}</div>${all}${items}</div>`;
    }).join('');
  }

  // ---- views -------------------------------------------------------------
  function renderTop() {
    const p = state.projects.find((x) => x.id === state.workspace);
    $('scope-title').textContent = p ? (state.key != null ? `${state.key}` : `${p.name || p.id}: all instances`) : 'No project';
    const viz = state.viz;
    $('scope-sub').textContent = viz ? `project ${p ? p.id : ''} · participants ${viz.participants.length} / events ${viz.timelineTotal}` : '';
    document.querySelectorAll('.mode').forEach((b) => b.classList.toggle('is-active', b.dataset.view === state.view));
  }
  function render() {
    renderTop();
    const stage = $('stage');
    if (!state.viz) { stage.innerHTML = '<div class="empty">No project selected.</div>'; return; }
    if (state.view === 'graph') stage.innerHTML = graphHtml();
    else if (state.view === 'flow') { stage.innerHTML = flowHtml(); scrollFlowToEnd(); }
    else stage.innerHTML = tracesHtml();
    stage.dataset.view = state.view;
  }

  // Graph: connectors and people on the left, agents in the middle, tools on the right.
  function graphHtml() {
    const viz = state.viz;
    const parts = viz.participants.filter((p) => p.kind !== 'task' && p.kind !== 'system');
    if (!parts.length) return '<div class="empty">No interactions yet.</div>';
    const col = (p) => (p.kind === 'agent' ? 1 : p.kind === 'tool' ? 2 : 0);
    const cols = [[], [], []];
    [...parts].sort((a, b) => a.label.localeCompare(b.label)).forEach((p) => cols[col(p)].push(p));
    const W = 210, H = 46, GX = 170, GY = 56, PAD = 20, LEFT = 120;
    const pos = {};
    const rows = Math.max(...cols.map((c) => c.length));
    const height = PAD * 2 + rows * (H + GY);
    cols.forEach((c, ci) => {
      const offset = (height - c.length * (H + GY) + GY) / 2;
      c.forEach((p, ri) => { pos[p.id] = { x: LEFT + ci * (W + GX), y: offset + ri * (H + GY), p }; });
    });
    const width = LEFT + PAD + 3 * W + 2 * GX;
    let edges = '';
    for (const e of viz.interactions) {
      const a = pos[e.a], b = pos[e.b];
      if (!a || !b) continue;
      // Drawn from the sender to the receiver; both ways: arrows at both ends.
      const [from, to] = e.direction === 'b->a' ? [b, a] : [a, b];
      let d, lx, ly;
      if (from.x === to.x && Math.abs(from.y - to.y) === H + GY) {
        // Two agents next to each other: a line between them.
        const x = from.x + W / 2, down = from.y < to.y;
        const y1 = down ? from.y + H : from.y, y2 = down ? to.y : to.y + H;
        d = `M ${x} ${y1} L ${x} ${y2}`;
        lx = x + 34; ly = (y1 + y2) / 2;
      } else if (from.x === to.x) {
        // Two agents further apart: an arc on the left of their column.
        const x = from.x, y1 = from.y + H / 2, y2 = to.y + H / 2;
        d = `M ${x} ${y1} C ${x - 130} ${y1}, ${x - 130} ${y2}, ${x} ${y2}`;
        lx = x - 98; ly = (y1 + y2) / 2;
      } else {
        const x1 = from.x < to.x ? from.x + W : from.x, x2 = from.x < to.x ? to.x : to.x + W;
        const y1 = from.y + H / 2, y2 = to.y + H / 2, bend = from.x < to.x ? 70 : -70;
        d = `M ${x1} ${y1} C ${x1 + bend} ${y1}, ${x2 - bend} ${y2}, ${x2} ${y2}`;
        // The label nearer the sender, clear of arcs between agents.
        const t = 0.35, u = 1 - t;
        const pt = (a, b, c, e) => u * u * u * a + 3 * u * u * t * b + 3 * u * t * t * c + t * t * t * e;
        lx = pt(x1, x1 + bend, x2 - bend, x2); ly = pt(y1, y1, y2, y2);
      }
      const markers = e.direction === 'undirected' ? 'marker-start="url(#arrow-back)" marker-end="url(#arrow)"' : 'marker-end="url(#arrow)"';
      const text = `×${e.total}`;
      const errs = e.errors ? ` · ${e.errors} failed` : '';
      const tw = (text.length + errs.length) * 6.6 + 10;
      edges += `<g class="edge${e.errors ? ' has-errors' : ''}${state.selectedEdge === e.key ? ' is-selected' : ''}" data-edge="${esc(e.key)}" data-total="${e.total}" data-errors="${e.errors || 0}">
        <path d="${d}" ${markers}></path><path class="hit" d="${d}"></path>
        <rect class="edge-label-bg" x="${lx - tw / 2}" y="${ly - 9}" width="${tw}" height="16" rx="4"></rect>
        <text class="edge-label" x="${lx}" y="${ly + 3}" text-anchor="middle">${esc(text)}<tspan class="err">${esc(errs)}</tspan></text></g>`;
    }
    let nodes = '';
    for (const id in pos) {
      const { x, y, p } = pos[id];
      nodes += `<g class="node ${esc(p.kind)}" data-node="${esc(p.id)}" transform="translate(${x},${y})">
        <rect width="${W}" height="${H}" rx="8"></rect>
        <text class="kind" x="12" y="17">${esc(p.kind)}</text>
        <text x="12" y="35">${esc(p.label.length > 26 ? p.label.slice(0, 25) + '…' : p.label)}</text></g>`;
    }
    return `<div class="graph-wrap"><div class="legend">Edges count what passed between two participants (connector events, handoffs, tool calls); click one for its history.</div>
      <svg class="graph-svg" id="graph" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">
      <defs><marker id="arrow" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#6a7d92"></path></marker>
      <marker id="arrow-back" markerWidth="8" markerHeight="8" refX="1" refY="4" orient="auto"><path d="M8,0 L0,4 L8,8 z" fill="#6a7d92"></path></marker></defs>
      ${edges}${nodes}</svg></div>`;
  }

  // Flow: one lane per connector, person and agent; messages and handoffs
  // as arrows between lanes, tool calls and tasks inline in their agent's lane.
  const FLOW_KINDS = new Set(['connector.accepted', 'connector.done', 'connector.dropped', 'message.user', 'message.connector',
    'message.agent', 'message.task', 'message.assistant', 'agent.request.sent', 'agent.response.sent', 'agent.send.sent',
    'tool.completed', 'tool.failed', 'task.opened', 'task.completed', 'task.failed', 'task.cancelled', 'turn.failed']);
  function lanes() {
    const seen = new Map();
    const add = (id) => {
      const k = kindOf(id);
      if ((k === 'agent' || k === 'connector' || k === 'user') && !seen.has(id)) seen.set(id, k);
    };
    (state.viz.participants || []).forEach((p) => add(p.id));
    state.timeline.forEach((e) => { add(e.source); add(e.target); });
    const order = { connector: 0, user: 1, agent: 2 };
    return [...seen.entries()].sort((a, b) => order[a[1]] - order[b[1]] || a[0].localeCompare(b[0])).map(([id, k]) => ({ id, kind: k }));
  }
  function flowRow(e, laneIndex, n, isNew) {
    if (!FLOW_KINDS.has(e.subtype)) return '';
    const cols = `grid-template-columns: 96px repeat(${n}, minmax(170px, 1fr))`;
    const bg = Array.from({ length: n }, (_, i) => `<div class="lane-bg" style="grid-column:${i + 2};grid-row:1"></div>`).join('');
    const s = laneIndex.get(e.source), t = laneIndex.get(e.target);
    const failed = e.status === 'error' || e.subtype.endsWith('.failed');
    let cell;
    if (e.subtype === 'tool.completed' || e.subtype === 'tool.failed') {
      const lane = t != null ? t : s;
      const cls = failed ? 'error' : e.status === 'pending' ? 'pending' : 'tool';
      cell = `<div class="cell" style="grid-column:${lane + 2};grid-row:1"><span class="chip ${cls}" title="${esc(e.detail)}">⚙ ${esc(e.detail)}<span class="dur">${dur(e.duration)}</span></span></div>`;
    } else if (e.subtype.startsWith('task.') || e.subtype === 'turn.failed' || e.subtype === 'connector.done' || e.subtype === 'connector.dropped') {
      const lane = e.subtype.startsWith('connector.') ? s : (s != null ? s : t);
      const cls = failed ? 'error' : e.subtype.startsWith('task.') ? 'task' : 'tool';
      const icon = e.subtype.startsWith('task.') ? '⚙' : e.subtype.startsWith('connector.') ? '✓' : '✗';
      cell = `<div class="cell" style="grid-column:${(lane == null ? 0 : lane) + 2};grid-row:1"><span class="chip ${cls}" title="${esc(e.subtype + ': ' + e.detail)}">${icon} ${esc(e.subtype)}: ${esc(e.detail)}<span class="dur">${dur(e.duration)}</span></span></div>`;
    } else if (s != null && t != null && s !== t) {
      const [a, b] = s < t ? [s, t] : [t, s];
      const dir = s < t ? 'right' : 'left';
      const cls = e.subtype.startsWith('agent.') ? 'handoff' : e.subtype.startsWith('connector') || e.subtype === 'message.connector' ? 'connector' : '';
      const text = e.subtype.startsWith('agent.') ? e.detail : `${e.subtype.replace('message.', '')}: ${e.detail}`;
      const line = dir === 'right' ? '<span class="bar"></span><span class="head"></span>' : '<span class="head"></span><span class="bar"></span>';
      cell = `<div class="cell arrow ${dir} ${cls}" style="grid-column:${a + 2} / ${b + 3};grid-row:1" title="${esc(e.subtype + ': ' + e.detail)}"><span class="lbl">${esc(text)}</span><span class="line">${line}</span></div>`;
    } else {
      const lane = s != null ? s : t != null ? t : 0;
      cell = `<div class="cell" style="grid-column:${lane + 2};grid-row:1"><span class="chip msg" title="${esc(e.subtype)}">${esc(e.subtype.replace('message.', ''))}: ${esc(e.detail)}</span></div>`;
    }
    return `<div class="flow-row${isNew ? ' is-new' : ''}" style="${cols}" data-seq="${e.seq}" data-subtype="${esc(e.subtype)}"><div class="flow-time" style="grid-column:1;grid-row:1">${clock(e.atMs)}</div>${bg}${cell}</div>`;
  }
  function flowHtml() {
    const ls = lanes();
    if (!ls.length) return '<div class="empty">Nothing happened here yet.</div>';
    state.flowLanes = ls.map((l) => l.id).join('|');
    const laneIndex = new Map(ls.map((l, i) => [l.id, i]));
    const head = `<div class="flow-head" style="grid-template-columns: 96px repeat(${ls.length}, minmax(170px, 1fr))"><div>time (UTC)</div>${ls.map((l) => `<div class="lane-${l.kind}" data-lane="${esc(l.id)}">${esc(label(l.id))}</div>`).join('')}</div>`;
    const more = (state.viz.timelineStart > 0 || state.timeline.length < state.viz.timelineTotal) && state.timeline.length && state.timeline[0].seq !== undefined
      ? `<div class="more"><button type="button" id="earlier">Show earlier (${state.viz.timelineTotal - state.timeline.length} more)</button></div>` : '';
    const rows = state.timeline.map((e) => flowRow(e, laneIndex, ls.length, false)).join('');
    return `<div class="flow" id="flow">${head}${more}<div id="flow-rows">${rows}</div></div>`;
  }
  function scrollFlowToEnd() {
    const stage = $('stage');
    stage.scrollTop = stage.scrollHeight;
  }
  function appendFlow(entries) {
    const rowsEl = $('flow-rows');
    if (!rowsEl) return;
    const ls = lanes();
    if (ls.map((l) => l.id).join('|') !== state.flowLanes) { render(); return; }
    const laneIndex = new Map(ls.map((l, i) => [l.id, i]));
    const stage = $('stage');
    const atEnd = stage.scrollHeight - stage.scrollTop - stage.clientHeight < 60;
    rowsEl.insertAdjacentHTML('beforeend', entries.map((e) => flowRow(e, laneIndex, ls.length, true)).join(''));
    if (atEnd) scrollFlowToEnd();
  }

  // Traces: the newest traces, and one trace's spans as a waterfall.
  function tracesHtml() {
    const list = state.viz.traces || [];
    const items = list.map((t) => `<button type="button" class="trace-item${t.traceId === state.traceId ? ' is-active' : ''}" data-trace="${esc(t.traceId)}">
        <div class="t1">${esc(t.title || t.traceId.slice(0, 8))}${t.errors ? `<span class="badge err">${t.errors} failed</span>` : ''}${t.completedAt ? '' : '<span class="badge run">running</span>'}</div>
        <div class="t2">${clock(t.startedAtMs)} · ${esc(t.agentNames.join(' → '))} · ${dur(t.totalDuration)} · ${t.toolCalls} tool calls</div></button>`).join('');
    const listHtml = list.length ? items : '<div class="empty">No traces yet.</div>';
    return `<div class="traces"><div class="trace-list" id="trace-list">${listHtml}</div><div class="waterfall" id="waterfall">${waterfallHtml()}</div></div>`;
  }
  function waterfallHtml() {
    const t = state.trace;
    if (!t) return `<div class="empty">${state.traceId ? 'Loading the trace…' : 'Pick a trace.'}</div>`;
    const start = t.startedAtMs;
    let end = Math.max(t.completedAtMs || start, start + 1);
    const rows = [];
    const walk = (span, depth) => {
      rows.push([span, depth]);
      if (span.status === 'working') end = Math.max(end, t.nowMs || Date.now());
      (span.children || []).forEach((c) => walk(c, depth + 1));
    };
    (t.rootSpans || []).forEach((s) => walk(s, 0));
    const total = end - start;
    const names = { connector: 'event', turn: 'turn', step: 'step', model: 'model', tool: 'tool', task: 'task' };
    const body = rows.map(([s, depth]) => {
      const sEnd = s.completedAtMs != null ? s.completedAtMs : (s.status === 'working' || s.status === 'started' ? end : s.startedAtMs);
      const left = ((s.startedAtMs - start) / total) * 100;
      const width = Math.max(((sEnd - s.startedAtMs) / total) * 100, 0.3);
      const shown = s.duration != null ? dur(s.duration) : s.status;
      const link = s.linkedTraceId ? ` <a href="#" class="trace-link" data-trace="${esc(s.linkedTraceId)}">→ its end's turn</a>` : '';
      return `<div class="span-row s-${esc(s.status)}" data-span="${esc(s.spanId)}" data-type="${esc(s.type)}" data-status="${esc(s.status)}">
        <div class="span-name" style="padding-left:${depth * 16}px"><span class="ty">${esc(names[s.type] || s.type)}</span>${esc(s.detail)}${s.errorCode ? ` <span class="badge err">${esc(s.errorCode)}</span>` : ''}${link}</div>
        <div class="span-track"><div class="span-bar t-${esc(s.type)} s-${esc(s.status)}" style="left:${left}%;width:${Math.min(width, 100 - left)}%"></div></div>
        <div class="span-dur">${esc(shown)}</div></div>`;
    }).join('');
    return `<div class="wf-head" data-trace="${esc(t.traceId)}">trace ${esc(t.traceId)} · ${clock(start)} · ${dur(total)} · ${esc((t.agentNames || []).join(', '))}</div>${body}`;
  }

  // ---- flyout ----------------------------------------------------------
  function openFlyout(title, html) {
    $('flyout-title').textContent = title;
    $('flyout-body').innerHTML = html;
    $('flyout').classList.add('is-open');
    $('flyout').setAttribute('aria-hidden', 'false');
  }
  function closeFlyout() {
    $('flyout').classList.remove('is-open');
    $('flyout').setAttribute('aria-hidden', 'true');
    state.selectedEdge = null;
    document.querySelectorAll('.edge.is-selected').forEach((g) => g.classList.remove('is-selected'));
  }
  function showEdge(key) {
    const e = (state.viz.interactions || []).find((x) => x.key === key);
    if (!e) return;
    state.selectedEdge = key;
    document.querySelectorAll('.edge').forEach((g) => g.classList.toggle('is-selected', g.dataset.edge === key));
    const hist = [...e.history].reverse().map((h) => `<div class="hist"><div class="meta">${clock(Date.parse(h.at))} · ${esc(label(h.from))} → ${esc(label(h.to))} · ${esc(h.kind)}</div><div>${esc(h.detail)}</div></div>`).join('');
    openFlyout(`${label(e.a)} ↔ ${label(e.b)}`, `<div class="meta">${e.total} in all${e.errors ? `, ${e.errors} failed` : ''}; the newest ${e.history.length}:</div>${hist}`);
  }
  function findSpan(spans, id) {
    for (const s of spans || []) {
      if (s.spanId === id) return s;
      const found = findSpan(s.children, id);
      if (found) return found;
    }
    return null;
  }
  function showSpan(id) {
    const s = state.trace && findSpan(state.trace.rootSpans, id);
    if (!s) return;
    const fields = ['type', 'detail', 'status', 'agentName', 'instanceKey', 'startedAt', 'completedAt', 'duration', 'errorCode', 'toolCallId', 'spanId', 'parentSpanId', 'linkedTraceId'];
    let html = '<div class="kv">' + fields.filter((f) => s[f] != null).map((f) => `<div class="k">${f}</div><div>${esc(f === 'duration' ? dur(s[f]) : s[f])}</div>`).join('');
    if (s.tokenUsage) html += `<div class="k">tokens</div><div>${s.tokenUsage.promptTokens} in · ${s.tokenUsage.completionTokens} out</div>`;
    html += '</div>';
    if (s.events) html += s.events.map((ev) => `<div class="hist"><div class="meta">${clock(Date.parse(ev.at))} · ${esc(ev.name)}</div><div>${esc(ev.detail)}</div></div>`).join('');
    openFlyout(s.detail || s.type, html);
  }

  // ---- interaction -----------------------------------------------------
  async function selectScope(ws, key) {
    const t0 = performance.now();
    state.workspace = ws;
    state.key = key;
    state.traceId = null;
    state.trace = null;
    closeFlyout();
    writeHash();
    renderSidebar();
    await loadViz();
    render();
    await nextPaint();
    timings.switches.push({ what: 'scope', key, ms: performance.now() - t0 });
  }
  async function selectView(view) {
    const t0 = performance.now();
    state.view = view;
    if (view === 'traces' && !state.traceId && state.viz && state.viz.traces.length) {
      state.traceId = state.viz.traces[0].traceId;
      await loadTrace();
    }
    writeHash();
    render();
    await nextPaint();
    timings.switches.push({ what: 'view', view, ms: performance.now() - t0 });
  }
  async function selectTrace(id) {
    const t0 = performance.now();
    state.traceId = id;
    if (state.view !== 'traces') state.view = 'traces';
    await loadTrace();
    writeHash();
    render();
    await nextPaint();
    timings.switches.push({ what: 'trace', ms: performance.now() - t0 });
  }
  const nextPaint = () => new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));

  document.addEventListener('click', (ev) => {
    const target = ev.target.closest('[data-view],[data-ws],[data-edge],[data-trace],[data-span],#earlier,#flyout-close');
    if (!target) return;
    if (target.id === 'flyout-close') { closeFlyout(); return; }
    if (target.id === 'earlier') { loadEarlier(); return; }
    if (target.classList.contains('mode')) { selectView(target.dataset.view); return; }
    if (target.dataset.ws) { selectScope(target.dataset.ws, target.dataset.key != null ? target.dataset.key : null); return; }
    if (target.dataset.edge) { showEdge(target.dataset.edge); return; }
    if (target.dataset.trace && (target.classList.contains('trace-item') || target.classList.contains('trace-link'))) {
      ev.preventDefault();
      selectTrace(target.dataset.trace);
      return;
    }
    if (target.dataset.span) showSpan(target.dataset.span);
  });
  document.addEventListener('keydown', (ev) => { if (ev.key === 'Escape') closeFlyout(); });

  // ---- live: server-sent events from the durable logs ---------------------
  const refreshLists = debounce(async () => { await loadLists(); renderTop(); }, 300);
  const refreshViz = debounce(async () => {
    const keepTimeline = state.timeline;
    await loadViz();
    // Keep what was loaded earlier by hand.
    if (keepTimeline.length > state.timeline.length) {
      const first = state.timeline.length ? state.timeline[0].seq : Infinity;
      const older = keepTimeline.filter((e) => !state.seen.has(e.seq) && e.seq !== first && e.atMs <= (state.timeline[0] || {}).atMs);
      older.forEach((e) => state.seen.add(e.seq));
      state.timeline = older.concat(state.timeline);
    }
    if (state.view === 'traces' && state.traceId) await loadTrace();
    if (state.view !== 'flow') render(); else renderTop();
  }, 250);
  function onEntries(msg) {
    if (msg.workspace !== state.workspace) { refreshLists(); return; }
    const mine = msg.entries.filter((e) => (state.key == null || e.instanceKey === state.key) && !(state.seen && state.seen.has(e.seq)));
    refreshLists();
    if (!mine.length) return;
    mine.forEach((e) => state.seen.add(e.seq));
    state.timeline = state.timeline.concat(mine);
    if (state.viz) state.viz.timelineTotal += mine.length;
    if (state.view === 'flow') appendFlow(mine);
    refreshViz();
  }
  function connect() {
    const source = new EventSource('/api/stream');
    source.onopen = () => setLive(true);
    source.onerror = () => setLive(false);
    source.onmessage = (ev) => {
      let msg;
      try { msg = JSON.parse(ev.data); } catch (e) { return; }
      setLive(true);
      if (msg.type === 'entries') {
        const now = Date.now();
        msg.entries.forEach((e) => timings.live.push({ seq: e.seq, subtype: e.subtype, detail: e.detail, atMs: e.atMs, receivedMs: now }));
        if (timings.live.length > 1000) timings.live.splice(0, timings.live.length - 1000);
        onEntries(msg);
      }
      else if (msg.type === 'reset') { refreshLists(); refreshViz(); }
    };
  }
  function setLive(on) {
    state.live = on;
    $('live').dataset.state = on ? 'live' : 'down';
    $('live-text').textContent = on ? 'live' : 'reconnecting';
  }

  // ---- start -------------------------------------------------------------
  async function start() {
    const t0 = performance.now();
    readHash();
    try {
      await loadLists();
      if (state.view === 'traces' && state.traceId) await loadTrace();
      await loadViz();
    } catch (e) {
      $('stage').innerHTML = `<div class="empty">Cannot read the studio's data: ${esc(e.message)}</div>`;
    }
    writeHash();
    render();
    await nextPaint();
    timings.firstPaint = performance.now();
    timings.firstPaintFromStart = performance.now() - t0;
    document.body.dataset.ready = '1';
    connect();
  }
  start();
})();
