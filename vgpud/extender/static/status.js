// vgpud status page: refresh, search, filters and paging over the JSON API
// (api/v1/gpus, api/v1/pods, api/v1/summary). The server renders the first page
// (vgpud/extender/status.py); the rows built here mirror that HTML. Every value goes
// in as text (textContent / text nodes), never as markup. URLs are relative to the
// page, so it also works behind a path prefix (kubectl proxy).
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  const body = document.body;
  const REFRESH_MS = (Number(body.dataset.refresh) || 5) * 1000;
  const DEBOUNCE_MS = 250;
  const PENDING_ON_PAGE = 100;
  const state = { offset: Number(body.dataset.offset) || 0, busy: null, debounce: null };

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') e.className = v;
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) {
      if (c !== null && c !== undefined) e.append(c);  // strings become text nodes
    }
    return e;
  }

  // -- formatting: as fmt_bytes / percent / level in status.py --------------------------
  const num = (n) => Number(n).toLocaleString('en-US');

  function fmtBytes(n) {
    const gib = n / 2 ** 30;
    return gib >= 1 ? gib.toFixed(1) + ' GiB' : (n / 2 ** 20).toFixed(0) + ' MiB';
  }

  function percent(used, cap) {
    if (cap <= 0) return used > 0 ? 100 : 0;
    const p = Math.floor((100 * used) / cap + 0.5);
    return Math.max(used > 0 ? 1 : 0, Math.min(100, p));
  }

  function level(used, cap) {
    if (cap > 0 && used >= cap) return 'full';
    if (cap > 0 && used / cap >= 0.7) return 'high';
    return 'ok';
  }

  function bar(used, cap) {
    return el('div', { class: 'bar' },
      el('span', { class: `fill w${percent(used, cap)} ${level(used, cap)}` }));
  }

  function meter(used, cap, text) {
    return el('div', { class: 'meter' }, bar(used, cap), el('span', { class: 'num' }, text));
  }

  // -- rows ------------------------------------------------------------------------------
  function sliceItem(s) {
    return el('li', null,
      el('span', { class: 'pod' }, `${s.namespace}/${s.pod}`),
      el('span', { class: 'ctr' }, s.container),
      el('span', { class: 'grant' }, `${fmtBytes(s.memory)} · ${s.cores} % · prio ${s.priority}`),
      s.state === 'assumed' ? ' ' : null,
      s.state === 'assumed' ? el('span', { class: 'tag' }, 'assumed') : null);
  }

  function gpuRow(r) {
    const health = el('td', { 'data-label': 'Health' },
      r.healthy ? el('span', { class: 'badge ok' }, 'healthy')
        : el('span', { class: 'badge bad' }, 'unhealthy'));
    if (r.mig) {
      health.append(' ', el('span', { class: 'badge' }, 'MIG mode'));
    } else if (r.parent) {
      health.append(' ', el('span', { class: 'badge', title: `on ${r.parent}` },
        `MIG ${r.profile || 'shared'}`));
    }
    if (r.dra) {
      health.append(' ', el('span', { class: 'badge', title: 'allocated by DRA ResourceClaims' },
        'DRA'));
    }
    const slices = r.slices.length
      ? el('ul', { class: 'slices' }, ...r.slices.map(sliceItem))
      : el('span', { class: 'muted' }, 'free');
    return el('tr', { class: r.healthy ? 'gpu' : 'gpu sick' },
      el('td', { 'data-label': 'Node', class: 'node' }, r.node),
      el('td', { 'data-label': 'GPU' }, el('span', { class: 'idx' }, `#${r.index}`), ' ',
        el('span', { class: 'uuid', title: r.uuid }, r.uuid)),
      el('td', { 'data-label': 'Model' }, r.model),
      health,
      el('td', { 'data-label': 'Memory' }, meter(r.memoryAllocated, r.memoryCapacity,
        `${fmtBytes(r.memoryAllocated)} / ${fmtBytes(r.memoryCapacity)}`)),
      el('td', { 'data-label': 'Cores' }, meter(r.coresAllocated, r.coresCapacity,
        `${r.coresAllocated} / ${r.coresCapacity} %`)),
      el('td', { 'data-label': 'vGPUs' }, meter(r.vgpusAllocated, r.vgpusCapacity,
        `${r.vgpusAllocated} / ${r.vgpusCapacity}`)),
      el('td', { 'data-label': 'Slices' }, slices));
  }

  function pendingRow(p) {
    return el('tr', null,
      el('td', { 'data-label': 'Pod', class: 'pod' }, `${p.namespace}/${p.name}`),
      el('td', { 'data-label': 'Priority' }, String(p.priority)),
      el('td', { 'data-label': 'Since' }, p.since || ''),
      el('td', { 'data-label': 'Reason', class: 'reason' }, p.reason || ''));
  }

  function share(used, cap) {
    if (cap <= 0) return '–';
    const p = (100 * used) / cap;
    return p > 0 && p < 1 ? '<1 %' : `${Math.floor(p + 0.5)} %`;
  }

  function tile(label, value, { used, cap, detail, alert } = {}) {
    const t = el('div', { class: alert ? 'tile alert' : 'tile' },
      el('span', { class: 'label' }, label), el('span', { class: 'value' }, value));
    if (cap !== undefined) t.append(bar(used, cap));
    if (detail) t.append(el('span', { class: 'detail' }, detail));
    return t;
  }

  function renderSummary(s) {
    const mem = { used: s.memoryAllocated, cap: s.memoryCapacity };
    const cores = { used: s.coresAllocated, cap: s.coresCapacity };
    const vgpus = { used: s.vgpusAllocated, cap: s.vgpusCapacity };
    $('summary').replaceChildren(
      tile('Nodes', num(s.nodes)),
      tile('GPUs', num(s.gpus)),
      tile('Unhealthy GPUs', num(s.unhealthyGpus), { alert: s.unhealthyGpus > 0 }),
      tile('Memory allocated', share(mem.used, mem.cap),
        { ...mem, detail: `${fmtBytes(mem.used)} of ${fmtBytes(mem.cap)}` }),
      tile('Cores allocated', share(cores.used, cores.cap),
        { ...cores, detail: `${num(cores.used)} of ${num(cores.cap)} %` }),
      tile('vGPUs in use', share(vgpus.used, vgpus.cap),
        { ...vgpus, detail: `${num(vgpus.used)} of ${num(vgpus.cap)}` }),
      tile('Pods holding GPUs', num(s.pods)),
      tile('Pending GPU pods', num(s.pendingPods), { alert: s.pendingPods > 0 }));
  }

  function renderPending(page) {
    $('pending-count').textContent = num(page.total);
    $('pending-table').querySelector('tbody').replaceChildren(...page.items.map(pendingRow));
    $('pending-table').hidden = page.items.length === 0;
    $('pending-empty').hidden = page.items.length > 0;
    $('pending-more').textContent = page.total > page.items.length
      ? `showing ${num(page.items.length)} of ${num(page.total)}; search to narrow` : '';
  }

  function renderGpus(page) {
    $('gpu-table').querySelector('tbody').replaceChildren(...page.items.map(gpuRow));
    let empty = $('gpus-empty');
    if (page.items.length === 0 && !empty) {
      empty = el('p', { class: 'empty', id: 'gpus-empty' }, 'No GPUs match.');
      $('gpu-table').before(empty);
    } else if (page.items.length > 0 && empty) {
      empty.remove();
    }
    $('range').textContent = page.total === 0 ? 'none'
      : `${num(page.offset + 1)}–${num(page.offset + page.items.length)} of ${num(page.total)}`;
    pager($('prev'), page.offset > 0, Math.max(0, page.offset - page.limit));
    pager($('next'), page.offset + page.items.length < page.total, page.offset + page.limit);
  }

  function pager(a, on, offset) {
    a.classList.toggle('off', !on);
    if (on) {
      a.href = pageUrl(offset);
      a.dataset.offset = String(offset);
    } else {
      a.removeAttribute('href');
    }
  }

  // -- queries ---------------------------------------------------------------------------
  function filters() {
    const out = {};
    for (const name of ['q', 'node', 'namespace', 'health']) {
      const v = $(name).value.trim();
      if (v) out[name] = v;
    }
    out.limit = $('limit').value;
    return out;
  }

  function params(offset) {
    const p = new URLSearchParams(filters());
    p.set('offset', String(offset));
    return p;
  }

  function pageUrl(offset) {  // the API's parameters, and the page's own
    const p = params(offset);
    if (REFRESH_MS !== 5000) p.set('refresh', String(REFRESH_MS / 1000));
    return '?' + p.toString();
  }

  function banner(text) {
    const b = $('banner');
    b.textContent = text || '';
    b.hidden = !text;
  }

  async function getJson(url, signal) {
    const r = await fetch(url, { signal, headers: { Accept: 'application/json' } });
    let doc = null;
    try {
      doc = await r.json();
    } catch (_) {
      doc = null;
    }
    if (!r.ok) throw new Error((doc && doc.error) || `${url}: HTTP ${r.status}`);
    return doc;
  }

  async function load() {
    if (state.busy) state.busy.abort();
    const ctl = new AbortController();
    state.busy = ctl;
    const f = filters();
    const gpus = params(state.offset);
    const pending = new URLSearchParams({ state: 'pending', limit: String(PENDING_ON_PAGE) });
    if (f.q) pending.set('q', f.q);
    if (f.namespace) pending.set('namespace', f.namespace);
    try {
      const [g, p, s] = await Promise.all([
        getJson('api/v1/gpus?' + gpus, ctl.signal),
        getJson('api/v1/pods?' + pending, ctl.signal),
        getJson('api/v1/summary', ctl.signal)]);
      if (g.total > 0 && g.offset >= g.total) {  // the list shrank under our page
        state.offset = Math.max(0, g.total - g.limit);
        state.busy = null;
        load();
        return;
      }
      renderSummary(s);
      renderPending(p);
      renderGpus(g);
      banner(null);
      history.replaceState(null, '', pageUrl(state.offset));
      $('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
      body.dataset.loaded = String(Number(body.dataset.loaded || 0) + 1);
    } catch (e) {
      if (e.name === 'AbortError') return;
      banner(`Could not refresh: ${e.message}. Retrying every ${REFRESH_MS / 1000} s.`);
    } finally {
      if (state.busy === ctl) state.busy = null;
    }
  }

  function restart() {
    state.offset = 0;
    clearTimeout(state.debounce);
    state.debounce = setTimeout(load, DEBOUNCE_MS);
  }

  function init() {
    $('filters').addEventListener('submit', (ev) => {
      ev.preventDefault();
      state.offset = 0;
      clearTimeout(state.debounce);
      load();
    });
    for (const id of ['q', 'node', 'namespace']) $(id).addEventListener('input', restart);
    for (const id of ['health', 'limit']) $(id).addEventListener('change', restart);
    for (const id of ['prev', 'next']) {
      $(id).addEventListener('click', (ev) => {
        ev.preventDefault();
        const a = ev.currentTarget;
        if (a.classList.contains('off')) return;
        state.offset = Number(a.dataset.offset) || 0;
        load();
        window.scrollTo({ top: $('gpus').offsetTop });
      });
    }
    for (const a of [$('prev'), $('next')]) {  // the server's links, as offsets
      if (a.href) a.dataset.offset = new URL(a.href).searchParams.get('offset') || '0';
    }
    $('apply').hidden = true;  // the filters apply as one types
    $('live').textContent = `auto-refresh every ${REFRESH_MS / 1000} s`;
    setInterval(() => {
      if (!document.hidden && !state.busy) load();
    }, REFRESH_MS);
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden && !state.busy) load();
    });
  }

  init();
})();
