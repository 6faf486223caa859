/* ranksight UI: fleet, job and alert pages on ECharts. One file, no build step.
 *
 * Served pages fetch JSON from /api/...; a report embeds the same JSON in a non-executable
 * <script type="application/json" id="ranksight-report"> block and never touches the network.
 * Every value from a record is data: the DOM is built from text nodes (el()), tooltips are DOM
 * elements built the same way (never HTML strings), links only take http(s) or same-site paths. Every time panel of a job shares one time window: zooming one
 * zooms all, and clicking an alert sets the window to the alert's span and highlights its
 * rank / GPU / node in every panel. State is on window.ranksight for tests and the curious.
 */
(function () {
  'use strict';

  const RS = (window.ranksight = { charts: {}, window: null, focus: null, data: null, ready: false, page: null });
  const REPORT = (() => {
    const block = document.getElementById('ranksight-report');
    return block ? JSON.parse(block.textContent) : null;
  })();
  const SEVERITY_ORDER = { critical: 0, warning: 1, info: 2 };
  const COLORS = {
    critical: '#d62728', warning: '#ff9f1c', info: '#4c78a8', resolved: '#6a9f58', resolvedBand: 'rgba(106,159,88,0.14)',
    checkpoint: 'rgba(90,120,200,0.16)', evaluation: 'rgba(60,160,90,0.16)', alert: 'rgba(214,39,40,0.10)',
  };
  // Every time panel has the same plot area, so one instant is at the same x in all of them.
  const GRID = { left: 170, right: 96, top: 26, bottom: 24 };
  const SEGMENT_COLORS = ['#8c6d31', '#4c78a8', '#72b7b2', '#54a24b', '#e45756', '#b279a2'];

  // --- small helpers ------------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') node.className = v;
      // Through the CSSOM: a style attribute would need 'unsafe-inline' in the page's CSP.
      else if (k === 'style') node.style.cssText = v;
      else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? '' : v);
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const pad2 = (n) => String(n).padStart(2, '0');
  function fmtTime(ms) {
    if (ms === null || ms === undefined) return '-';
    const d = new Date(ms);
    return `${pad2(d.getUTCHours())}:${pad2(d.getUTCMinutes())}:${pad2(d.getUTCSeconds())}`;
  }
  function fmtDateTime(ms) {
    if (ms === null || ms === undefined) return '-';
    return new Date(ms).toISOString().replace('T', ' ').slice(0, 19) + ' UTC';
  }
  // Times typed by hand are ISO 8601 in UTC ("2026-12-07 17:45"; a "T", seconds or a trailing "Z"
  // are accepted), never the browser's locale format (mm/dd/yyyy) beside a "UTC" label.
  const UTC_FORMAT = 'YYYY-MM-DD HH:MM';
  const utcInput = (ms) => new Date(ms).toISOString().slice(0, 16).replace('T', ' ');
  const UTC_TEXT = /^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2}))?)?\s*(?:Z|UTC)?$/i;
  function parseUtc(text) {
    const m = UTC_TEXT.exec(String(text).trim());
    if (!m) return NaN;
    const [y, mo, d, h, mi, sec] = m.slice(1).map((v) => Number(v || 0));
    const ms = Date.UTC(y, mo - 1, d, h, mi, sec);
    // Date.UTC rolls 2026-02-31 into March and 24:00 into the next day: a time that is not one is refused.
    const t = new Date(ms);
    const same = t.getUTCFullYear() === y && t.getUTCMonth() === mo - 1 && t.getUTCDate() === d && t.getUTCHours() === h && t.getUTCMinutes() === mi;
    return same ? ms : NaN;
  }
  function utcField(name, ms, label) {
    return el('input', { type: 'text', name, class: 'utc-time', value: ms === null || ms === undefined ? '' : utcInput(ms),
      placeholder: UTC_FORMAT, title: `${label}, UTC (ISO 8601: ${UTC_FORMAT})`, 'aria-label': `${label}, UTC, ${UTC_FORMAT}`,
      spellcheck: 'false', autocomplete: 'off', size: 16, oninput: (e) => e.target.setCustomValidity('') });
  }
  // A UTC field's time: null when empty, undefined (the field marked, one sentence saying how to
  // write it) when it is no time.
  function readUtc(input) {
    const text = input.value.trim();
    const ms = text ? parseUtc(text) : null;
    input.setCustomValidity(ms === null || Number.isFinite(ms) ? '' : `Write the time in UTC as ${UTC_FORMAT}, e.g. ${utcInput(Date.now())}.`);
    if (ms !== null && !Number.isFinite(ms)) {
      input.reportValidity();
      return undefined;
    }
    return ms;
  }
  function fmtDuration(ms) {
    if (ms === null || ms === undefined) return '-';
    const s = Math.max(0, Math.round(ms / 1000));
    if (s < 120) return `${s} s`;
    if (s < 7200) return `${Math.round(s / 60)} min`;
    return `${(s / 3600).toFixed(1)} h`;
  }
  // toPrecision rounds; Number() drops its trailing zeros and exponent ('1.50' -> 1.5, '1.00e+3' -> 1000).
  const fmtNum = (v, digits = 3) => (v === null || v === undefined ? '-' : String(Number(Number(v).toPrecision(digits))));
  const COMPACT = new Intl.NumberFormat('en', { notation: 'compact', maximumSignificantDigits: 3 });
  const fmtCompact = (v) => (v === null || v === undefined ? '—' : COMPACT.format(v));
  const fmtFixed = (v, digits) => (v === null || v === undefined ? '—' : Number(v).toFixed(digits));
  const alertHref = (a) => (REPORT ? `#alert-${a.alert_id}` : `/alerts/${encodeURIComponent(a.alert_id)}`);
  const jobHref = (id) => (REPORT ? '#' : `/jobs/${encodeURIComponent(id)}`);
  function where(a) {
    const parts = [];
    if (a.rank !== null && a.rank !== undefined) parts.push(`rank ${a.rank}`);
    if (a.node) parts.push(a.node);
    if (a.gpu_index !== null && a.gpu_index !== undefined) parts.push(`GPU ${a.gpu_index}`);
    return parts.join(' · ') || 'whole job';
  }
  // One label and its value, kept together in one grid cell whatever the width (a dt and a dd as
  // separate grid items land in different columns once a row holds an odd number of cells).
  const factPair = (label, value) => el('div', { class: 'fact' }, el('dt', {}, label), el('dd', {}, value === null || value === undefined || value === '' ? '-' : value));
  const badge = (severity, text) => el('span', { class: `badge ${severity}` }, text || severity);

  // --- muted alerts and routed copies -------------------------------------------------------------

  // "straggler, muted by gpu_throttling on the same GPU": a muted alert (`muted_by`) told by its cause.
  const mutedText = (a) => `${a.rule}, muted by ${a.muted_by.rule || a.muted_by.alert_id}${a.muted_by.scope ? ` ${a.muted_by.scope}` : ''}`;

  function folded(alerts) {
    // Each alert, with the alerts it mutes right under it; a muted alert whose cause is not in the list
    // stays where it is, marked. Returns [alert, cause or null] pairs in order.
    const byId = new Map(alerts.map((a) => [a.alert_id, a]));
    const out = [];
    for (const a of alerts) {
      if (a.muted_by && byId.has(a.muted_by.alert_id) && a.muted_by.alert_id !== a.alert_id) continue;
      out.push([a, null]);
      for (const id of a.mutes || []) if (byId.has(id) && id !== a.alert_id) out.push([byId.get(id), a]);
    }
    return out;
  }

  function copiesCell(a) {
    // Every routed copy: its team, and whether it paged or only informed (when the UI knows the receivers).
    const copies = a.copies && a.copies.length ? a.copies : [{ team: a.team, kind: null }];
    // The separator sits outside each (unbreakable) copy: a cell of several copies wraps between them.
    return copies.map((c, i) => [i ? ' · ' : null, el('span', { class: 'copy', 'data-kind': c.kind || '' }, el('strong', {}, c.team), c.kind ? ` ${c.kind}` : null)]).flat();
  }

  function silencedBadge(a) {
    const ids = RS.silences && RS.silences.silenced ? RS.silences.silenced[a.fingerprint] : null;
    return ids && ids.length ? el('span', { class: 'badge silenced', title: `silenced in Alertmanager (${ids.join(', ')})` }, 'silenced') : null;
  }

  // A URL from a record becomes a link only when it parses as http(s), or as a path on this site:
  // never javascript:, data: or anything else a browser would run. The URL parser decides, as the
  // browser will: `/\evil.example/x` looks like a path and opens http://evil.example/x.
  // Credentials in a URL are dropped. Reports (file://) have no site paths.
  function safeHref(url) {
    const s = String(url ?? '').trim();
    if (!s || /[\s\\\u0000-\u001f\u007f]/.test(s)) return null;
    let parsed;
    try {
      parsed = new URL(s, REPORT ? undefined : window.location.origin);
    } catch (e) {
      return null;
    }
    parsed.username = '';
    parsed.password = '';
    if (/^https?:\/\//i.test(s)) return parsed.protocol === 'http:' || parsed.protocol === 'https:' ? parsed.href : null;
    if (!REPORT && s.startsWith('/') && !s.startsWith('//') && parsed.origin === window.location.origin) return `${parsed.pathname}${parsed.search}${parsed.hash}`;
    return null;
  }
  RS.safeHref = safeHref; // for the tests

  function runbookHref(url) {
    // `docs/runbooks/<rule>` (relative, as alerts used to carry it) is served by this UI at
    // /runbooks/<rule>; an absolute URL (built from a configured base) is used as it is.
    const s = String(url ?? '').trim();
    const m = /^\/?(?:docs\/)?runbooks\/([A-Za-z0-9_.-]+?)(?:\.md)?$/.exec(s);
    if (m) return REPORT ? null : `/runbooks/${encodeURIComponent(m[1])}`;
    return safeHref(s);
  }
  function runbookLink(a) {
    if (!a.runbook_url) return 'no runbook';
    let href = runbookHref(a.runbook_url);
    // This UI's runbook pages fill their queries in with the alert's job, node, rank and GPU.
    if (href && href.startsWith('/runbooks/')) {
      const params = new URLSearchParams();
      for (const k of ['job_id', 'node', 'rank', 'gpu_index']) if (a[k] !== null && a[k] !== undefined && a[k] !== '') params.set(k, String(a[k]));
      if ([...params].length) href = `${href}?${params}`;
    }
    return href ? el('a', { href, target: '_blank', rel: 'noopener', class: 'runbook' }, 'runbook') : `runbook: ${a.runbook_url}`;
  }

  // Tooltips are DOM elements built from text nodes: ECharts inserts a returned element as it is
  // (a returned string would be parsed as HTML, and record strings are not markup).
  const tipLine = (color, name, value) => el('div', { class: 'tip-line' },
    typeof color === 'string' ? el('i', { class: 'dot', style: `background:${color}` }) : null, name,
    value === undefined || value === null ? null : el('b', {}, value));
  const tip = (title, ...lines) => el('div', { class: 'tip' }, el('div', { class: 'tip-title' }, title), ...lines);
  function axisTip(units) {
    // The tooltip of a time chart: the instant, then each series' value with its unit.
    return (params) => {
      const list = (Array.isArray(params) ? params : [params]).filter((p) => p && p.value !== undefined);
      if (!list.length) return el('div', { class: 'tip' });
      const first = list[0];
      const t = Array.isArray(first.value) ? first.value[0] : first.axisValue;
      return tip(fmtDateTime(t), ...list.map((p) => {
        const v = Array.isArray(p.value) ? p.value[1] : p.value;
        const unit = units[p.seriesName] || '';
        // A worst-rank point carries its rank third: [time, value, rank].
        const rank = Array.isArray(p.value) && Number.isInteger(p.value[2]) ? ` (rank ${p.value[2]})` : '';
        return tipLine(p.color, `${p.seriesName}: `, v === null || v === undefined ? '-' : `${fmtNum(v, 4)}${unit ? ` ${unit}` : ''}${rank}`);
      }));
    };
  }

  async function getJSON(url) {
    const response = await fetch(url, { headers: { accept: 'application/json' } });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
    return body;
  }
  function showError(root, message) {
    root.replaceChildren(el('div', { class: 'error' }, message));
  }

  // --- fleet page ---------------------------------------------------------------------------------

  function alertTable(alerts, resolved) {
    if (!alerts.length) return el('p', { class: 'muted' }, resolved ? 'none in the last 6 hours' : 'nothing firing');
    // A muted alert is listed under its cause ("straggler, muted by gpu_throttling on the same GPU").
    return el('table', { class: 'grid alerts' },
      el('thead', {}, el('tr', {}, ['severity', 'rule', 'job', 'where', 'team', resolved ? 'fired → resolved' : 'since', 'summary'].map((h) => el('th', {}, h)))),
      el('tbody', {}, folded(alerts).map(([a, cause]) => el('tr', { class: `${resolved ? 'row-resolved' : `row-${a.severity}`}${a.muted_by ? ' row-muted' : ''}`, 'data-alert': a.alert_id, 'data-muted-by': a.muted_by ? a.muted_by.alert_id : null },
        el('td', {}, cause ? el('span', { class: 'fold' }, '↳ ') : null, badge(a.muted_by ? 'muted' : a.severity, a.severity), silencedBadge(a)),
        el('td', {}, el('a', { href: alertHref(a) }, a.rule)),
        el('td', {}, el('a', { href: jobHref(a.job_id) }, a.job_id)),
        el('td', {}, where(a)),
        el('td', {}, copiesCell(a)),
        el('td', { class: 'nowrap' }, resolved ? `${fmtTime(a.starts_ms)} → ${fmtTime(a.ends_ms)}` : `${fmtTime(a.starts_ms)} (${fmtDuration((RS.data.now_ms || a.updated_ms) - a.starts_ms)})`),
        el('td', { class: 'summary' }, a.muted_by ? el('div', { class: 'muted-by' }, mutedText(a)) : null, a.summary, a.resolution ? el('div', { class: 'resolution' }, a.resolution) : null)))));
  }

  function silencesPanel() {
    // Alertmanager's silences (acknowledgements), read through its v2 API when the UI is told where it is.
    const s = RS.silences;
    if (!s || !s.configured) return null;
    if (s.error) return el('p', { class: 'muted', id: 'silences' }, `Alertmanager: ${s.error}`);
    if (!s.silences.length) return el('p', { class: 'muted', id: 'silences' }, 'No silence active in Alertmanager.');
    return el('div', { id: 'silences' }, el('h2', {}, `Silenced in Alertmanager (${s.silences.length})`),
      el('table', { class: 'grid silences' },
        el('thead', {}, el('tr', {}, ['silence', 'matchers', 'by', 'comment', 'until'].map((h) => el('th', {}, h)))),
        el('tbody', {}, s.silences.map((x) => el('tr', { 'data-silence': x.id },
          el('td', { class: 'nowrap' }, x.id), el('td', {}, x.matchers.map((m) => `${m.name}${m.op}${m.value}`).join(', ')),
          el('td', {}, x.created_by), el('td', { class: 'summary' }, x.comment), el('td', { class: 'nowrap' }, x.ends_at))))));
  }

  async function loadSilences(root) {
    try {
      RS.silences = await getJSON('/api/fleet/silences');
    } catch (err) {
      RS.silences = { configured: true, error: err.message, silences: [], silenced: {} };
    }
    renderFleet(root, RS.data);
    RS.silencesReady = true;
  }

  function goodputCell(j) {
    // The served page fills goodput in after the table (`/api/fleet/goodput`); a report carries it.
    const pct = RS.goodput ? RS.goodput[j.job_id] : j.goodput_pct;
    const text = RS.goodput || REPORT ? (pct === null || pct === undefined ? '—' : `${fmtFixed(pct, 1)} %`) : '…';
    return el('td', { class: 'num', 'data-goodput': pct ?? '', title: 'productive GPU-hours / allocated GPU-hours over every run (job_efficiency)' }, text);
  }

  async function loadGoodput(root) {
    try {
      RS.goodput = await getJSON('/api/fleet/goodput');
    } catch (err) {
      RS.goodput = {};
    }
    renderFleet(root, RS.data);
    RS.goodputReady = true;
  }

  function renderFleet(root, data) {
    RS.data = data;
    const team = RS.filters?.team || '';
    const cluster = RS.filters?.cluster || '';
    const keep = (x) => (!team || x.team === team) && (!cluster || x.cluster === cluster);
    const select = (name, values, current) => el('select', {
      name, onchange: (e) => { RS.filters = { ...RS.filters, [name]: e.target.value }; renderFleet(root, RS.data); },
    }, el('option', { value: '' }, `all ${name}s`), values.map((v) => el('option', v === current ? { value: v, selected: true } : { value: v }, v)));
    const jobs = data.jobs.filter(keep);
    const rows = jobs.map((j) => {
      // A finished job makes no progress by design: only a job that should step is flagged.
      const finished = ['completed', 'failed', 'preempted'].includes(j.state);
      const stale = !finished && j.last_progress_ms && data.now_ms - j.last_progress_ms > 120000;
      const firing = ['critical', 'warning', 'info'].filter((s) => j.firing[s]).map((s) => badge(s, `${j.firing[s]} ${s}`));
      return el('tr', { 'data-job': j.job_id, class: firing.length ? 'unhealthy' : '' },
        el('td', {}, el('a', { href: jobHref(j.job_id) }, j.job_id)),
        el('td', {}, firing.length ? firing : stale ? badge('warning', 'no progress') : el('span', { class: 'ok' }, finished ? j.state : 'healthy')),
        el('td', {}, j.state || '-'),
        el('td', {}, j.team), el('td', {}, j.cluster), el('td', {}, j.owner),
        el('td', { class: 'num' }, j.world_size || '-'),
        el('td', { class: 'num' }, j.last_step ?? '-'),
        el('td', { class: stale ? 'stale nowrap' : 'nowrap' }, j.last_progress_ms ? `${fmtTime(j.last_progress_ms)}${stale ? ` (no progress for ${fmtDuration(data.now_ms - j.last_progress_ms)})` : finished ? ` (${j.state})` : ''}` : '-'),
        el('td', { class: 'num' }, j.step_rate === null ? '-' : `${fmtNum(j.step_rate)} /s`),
        goodputCell(j),
        el('td', { class: 'num', title: 'proxy, not goodput: share of the minutes since the first step that have steps (a stalled job falls behind)' }, j.progress_time_frac === null ? '-' : `${Math.round(j.progress_time_frac * 100)} %`),
        el('td', {}, j.model));
    });
    // Through el(): replaceChildren itself would print a null child (no Alertmanager configured) as "null".
    root.replaceChildren(...el('div', {},
      el('div', { class: 'toolbar' }, el('h1', {}, 'Fleet'), select('team', data.teams, team), select('cluster', data.clusters, cluster),
        el('span', { class: 'muted' }, `data up to ${fmtDateTime(data.now_ms)}`)),
      el('h2', {}, `Firing (${data.firing.filter(keep).filter((a) => !a.muted_by).length}${data.firing.filter(keep).some((a) => a.muted_by) ? `, ${data.firing.filter(keep).filter((a) => a.muted_by).length} muted under their cause` : ''})`), alertTable(data.firing.filter(keep), false),
      silencesPanel(),
      el('h2', {}, `Jobs (${jobs.length})`),
      el('table', { class: 'grid jobs' },
        el('thead', {}, el('tr', {}, ['job', 'health', 'state', 'team', 'cluster', 'owner', 'ranks', 'step', 'last progress', 'step rate', 'goodput', 'minutes with steps (proxy)', 'model'].map((h) => el('th', {}, h)))),
        el('tbody', {}, rows)),
      el('h2', {}, `Recently resolved (${data.resolved.filter(keep).length})`), alertTable(data.resolved.filter(keep), true)).childNodes);
    RS.ready = true;
  }

  // --- alert history: what fired for a job, node, rule or team, over a time range -----------------

  function renderHistory(root, data) {
    RS.data = data;
    const f = data.filters;
    const text = (name, value, placeholder) => el('input', { type: 'text', name, value: value || '', placeholder });
    const choose = (name, values, current, all) => el('select', { name },
      el('option', { value: '' }, all), values.map((v) => el('option', { value: v, selected: v === current }, v)));
    const when = (name, ms) => utcField(name, ms, name);
    const form = el('form', { class: 'toolbar history-filters', id: 'history-filters', novalidate: true, onsubmit: (e) => {
      e.preventDefault();
      const params = new URLSearchParams();
      for (const k of ['job', 'node', 'rule', 'team']) if (form.elements[k].value) params.set(k, form.elements[k].value);
      for (const k of ['from', 'to']) {
        const ms = readUtc(form.elements[k]);
        if (ms === undefined) return; // not a time: the field says how to write one
        if (ms !== null) params.set(k, String(ms));
      }
      location.assign(`/history${params.toString() ? `?${params}` : ''}`);
    } },
      text('job', f.job, 'job id'), text('node', f.node, 'node'), choose('rule', data.rules, f.rule, 'every rule'), choose('team', data.teams, f.team, 'every team'),
      when('from', f.from), '–', when('to', f.to), el('span', { class: 'muted' }, 'UTC'), el('button', { type: 'submit' }, 'filter'));
    const firing = data.alerts.filter((a) => a.status === 'firing');
    const resolved = data.alerts.filter((a) => a.status !== 'firing');
    root.replaceChildren(el('h1', {}, 'Alert history'), form,
      el('p', { class: 'muted', id: 'history-count' }, `${data.alerts.length} alert${data.alerts.length === 1 ? '' : 's'}, newest first${data.truncated ? ' (the newest only: narrow the filter for older ones)' : ''}`),
      el('h2', {}, `Firing (${firing.length})`), alertTable(firing, false),
      el('h2', {}, `Resolved (${resolved.length})`), resolved.length ? alertTable(resolved, true) : el('p', { class: 'muted' }, 'none'));
    RS.ready = true;
  }

  // --- job page: charts on one time axis ----------------------------------------------------------

  // A CSV cell: quoted when it holds a separator, and a leading = + - @ made text (a record string
  // must not become a spreadsheet formula).
  function csvCell(v) {
    if (v === null || v === undefined) return '';
    let s = String(v);
    if (/^[=+\-@\t\r]/.test(s) && !/^-?[\d.]+(e[+-]?\d+)?$/i.test(s)) s = `'${s}`;
    return /[",\n\r]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  }

  const iso = (t) => (Number.isFinite(Number(t)) ? new Date(Number(t)).toISOString() : t);
  function chartCsv(chart) {
    // Every point a panel draws, one row each: series, time (UTC), row (heatmaps), value and its extras.
    const opt = chart.getOption();
    const xAxis = (opt.xAxis || [])[0] || {};
    const yAxis = (opt.yAxis || [])[0] || {};
    const xCat = xAxis.type === 'category' ? xAxis.data : null;
    const yCat = yAxis.type === 'category' ? yAxis.data : null;
    const lines = [['series', 'time_utc', 'row', 'value', 'detail']];
    for (const s of opt.series || []) {
      if (s.type === 'custom') {
        // The timeline: one row per span (lane, from, to, what it was).
        const raw = RS.timelineItems || [];
        for (const d of raw) lines.push(['span', iso(d.value[1]), yCat ? yCat[d.value[0]] : d.value[0], iso(d.value[2]), d.label || (d.alert ? `${d.alert.status}: ${d.alert.summary}` : '')]);
        continue;
      }
      for (const d of s.data || []) {
        const v = Array.isArray(d) ? d : d && d.value;
        if (!Array.isArray(v)) continue;
        const t = xCat ? xCat[v[0]] : v[0];
        lines.push(yCat ? [s.name, iso(t), yCat[v[1]], v[2], v[3]] : [s.name, iso(t), '', v[1], v[2]]);
      }
    }
    return lines.map((l) => l.map(csvCell).join(',')).join('\n') + '\n';
  }
  RS.chartCsv = (key) => chartCsv(RS.charts[key]);

  function csvButton(key) {
    return el('button', { class: 'csv', title: 'download this panel\'s data as CSV', 'data-csv': key, onclick: (e) => {
      e.stopPropagation();
      const name = RS.data && RS.data.job ? RS.data.job.job_id : RS.page && RS.page.id;
      const link = el('a', { href: URL.createObjectURL(new Blob([chartCsv(RS.charts[key])], { type: 'text/csv' })),
        download: `ranksight-${String(name || 'page').replace(/[^A-Za-z0-9._-]/g, '_').slice(0, 80)}-${key}.csv` });
      document.body.append(link);
      link.click();
      link.remove();
    } }, 'CSV');
  }

  function chartBox(container, key, title, height, extra, below) {
    const box = el('section', { class: 'panel', id: `panel-${key}` }, el('h3', {}, title, extra || null, csvButton(key)), below || null, el('div', { class: 'chart', style: `height:${height}px` }));
    container.append(box);
    const chart = echarts.init(box.querySelector('.chart'), null, { renderer: 'canvas' });
    RS.charts[key] = chart;
    return chart;
  }

  function annotations(data) {
    // Alerts, checkpoints and evaluations as translucent bands on every time panel.
    const areas = [];
    const to = data.range.to_ms;
    for (const c of data.checkpoints) areas.push([{ xAxis: c.start_ms, itemStyle: { color: COLORS.checkpoint } }, { xAxis: c.end_ms || to }]);
    for (const e of data.evaluations) areas.push([{ xAxis: e.start_ms, itemStyle: { color: COLORS.evaluation } }, { xAxis: e.end_ms || to }]);
    // Alert spans carry the rule as a label while they are few enough to read.
    const labelled = data.alerts.length <= 4;
    data.alerts.forEach((a, i) => {
      areas.push([{ xAxis: a.starts_ms, name: a.rule, itemStyle: { color: a.status === 'resolved' ? COLORS.resolvedBand : COLORS.alert },
        label: { show: labelled, position: 'insideTopLeft', fontSize: 9, color: '#a11', offset: [0, i * 11] } },
      { xAxis: a.status === 'resolved' && a.ends_ms ? a.ends_ms : to }]);
    });
    return { silent: true, data: areas };
  }

  function timeOption(data, series, yName, extra) {
    // A series may name its own unit (`unit`); the rest are in the chart's y unit.
    const units = Object.fromEntries(series.map((s) => [s.name, s.unit ?? yName]));
    return Object.assign({
      animation: false,
      grid: GRID,
      tooltip: { trigger: 'axis', formatter: axisTip(units) },
      // Right bound: a long legend scrolls instead of running over the right y axis' name.
      legend: { top: 0, left: GRID.left + 48, right: GRID.right, type: 'scroll', textStyle: { fontSize: 11 } },
      xAxis: { type: 'time', min: data.range.from_ms, max: data.range.to_ms, axisLabel: { formatter: (v) => fmtTime(v).slice(0, 5), hideOverlap: true } },
      yAxis: { type: 'value', name: yName, nameTextStyle: { align: 'left' }, scale: true, splitNumber: 3 },
      dataZoom: [{ type: 'inside', xAxisIndex: 0, filterMode: 'none' }],
      series: series.map((s, i) => Object.assign({ type: 'line', showSymbol: false, sampling: 'lttb', connectNulls: false, lineStyle: { width: 1.5 } }, s, i === 0 ? { markArea: annotations(data) } : {})),
    }, extra || {});
  }

  const GPU_COLUMNS = { util: 2, power: 3, sm_clock: 4, mem_used: 5 };
  // Rank times: slow is hot. GPU activity: idle is hot (a busy GPU is the healthy state).
  const SLOW_IS_HOT = ['#f7fbff', '#c6dbef', '#6baed6', '#2171b5', '#fdae61', '#d7191c'];
  const IDLE_IS_HOT = ['#d7191c', '#fdae61', '#ffffbf', '#a6d96a', '#1a9641'];

  function gpuBands(data, buckets, column) {
    // Min, median and max across the job's GPUs per bucket: one outlier GPU shows as a gap from the median.
    // A job of many GPUs has them worked out by the server (its cells are per node row).
    if (data.gpus.bands) return data.gpus.bands[Object.keys(GPU_COLUMNS).find((k) => GPU_COLUMNS[k] === column)];
    const [xs] = data.gpus.cells;
    const values = data.gpus.cells[column] || [];
    const byBucket = new Map();
    for (let i = 0; i < (xs || []).length; i++) {
      if (values[i] === null) continue;
      if (!byBucket.has(xs[i])) byBucket.set(xs[i], []);
      byBucket.get(xs[i]).push(values[i]);
    }
    const out = { min: [], median: [], max: [] };
    for (const [x, list] of [...byBucket.entries()].sort((a, b) => a[0] - b[0])) {
      list.sort((a, b) => a - b);
      const t = buckets[x];
      out.min.push([t, list[0]]);
      out.median.push([t, list[Math.floor(list.length / 2)]]);
      out.max.push([t, list[list.length - 1]]);
    }
    return out;
  }

  function gpuSeries(data, buckets, gpu, column) {
    // A grouped page carries the lines of the GPUs its alerts name apart (`gpus.named`).
    const cells = data.gpus.rows ? data.gpus.named.cells : data.gpus.cells;
    const [xs, ids] = cells;
    const values = cells[column] || [];
    const out = [];
    for (let i = 0; i < (xs || []).length; i++) if (ids[i] === gpu) out.push([buckets[xs[i]], values[i]]);
    return out;
  }

  function bucketAxis(data) {
    const out = [];
    for (let t = data.range.from_ms; t < data.range.to_ms; t += data.range.bucket_ms) out.push(t);
    return out;
  }

  // Height per heatmap row: the 10 px row labels overlap below about 12 px (and the colour legend,
  // 120 px plus its two labels, needs a chart of about 200 px).
  const HEAT_ROW_PX = 12;

  function legendDigits(lo, hi) {
    // Significant digits enough for the scale's two ends to differ
    // (1.004 s and 1.031 s both read "1" at three significant digits: "1 ... 1").
    let digits = 3;
    while (digits < 8 && fmtNum(lo, digits) === fmtNum(hi, digits)) digits += 1;
    return digits;
  }

  function legendText(lo, hi, unit, fixedRange) {
    // The colour scale's two ends with their unit and meaning.
    const digits = legendDigits(lo, hi);
    const top = `${fmtNum(hi, digits)} ${unit}`;
    const bottom = `${fmtNum(lo, digits)} ${unit}`;
    return fixedRange ? [`${top} busy`, `${bottom} idle`] : [`${top} slow`, `${bottom} fast`];
  }

  function holdSamples(points, width) {
    // Samples sparser than the buckets (an agent every 30 s, 10 s buckets) left two empty columns of
    // three: each sample holds its cell until the row's next one, up to the usual spacing of samples.
    // A longer gap stays empty: missing telemetry is news.
    const byRow = new Map();
    for (const p of points) (byRow.get(p[1]) || byRow.set(p[1], []).get(p[1])).push(p);
    const gaps = [];
    for (const row of byRow.values()) {
      row.sort((a, b) => a[0] - b[0]);
      for (let i = 1; i < row.length; i++) gaps.push(row[i][0] - row[i - 1][0]);
    }
    if (!gaps.length) return;
    gaps.sort((a, b) => a - b);
    const usual = gaps[Math.floor(gaps.length / 2)];
    if (usual <= 1) return;
    for (const row of byRow.values()) {
      row.forEach((p, i) => {
        const next = i + 1 < row.length ? row[i + 1][0] : Math.min(width, p[0] + usual);
        if (next - p[0] > usual) return;
        for (let x = p[0] + 1; x < next; x++) points.push([x, ...p.slice(1)]);
      });
    }
  }

  function heatmapOption(data, buckets, rows, columns, valueIndex, name, unit, fixedRange, whoIndex, whoLabel) {
    // columns: [bucket index[], row index[], value columns...] as ClickHouse wrote them. `whoIndex`: the
    // column naming the rank (or GPU) a grouped row's value came from, shown as `whoLabel` in the tooltip.
    const points = [];
    let lo = Infinity, hi = -Infinity;
    const [times, rowIds] = columns;
    const values = columns[valueIndex] || [];
    const who = whoIndex === undefined ? null : columns[whoIndex] || [];
    for (let i = 0; i < (times || []).length; i++) {
      const v = values[i];
      const x = times[i];
      if (v === null || v === undefined || x < 0 || x >= buckets.length || !(rowIds[i] >= 0 && rowIds[i] < rows.length)) continue;
      points.push(who ? [x, rowIds[i], v, who[i]] : [x, rowIds[i], v]);
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    holdSamples(points, buckets.length);
    if (fixedRange) [lo, hi] = fixedRange;
    else if (!points.length) { lo = 0; hi = 1; }
    else {
      // A robust colour range: warm-up steps must not wash out a straggler's stripe, so anything far
      // above the median (in median absolute deviations) is already the hottest colour.
      const sorted = points.map((p) => p[2]).sort((a, b) => a - b);
      const q = (f) => sorted[Math.min(sorted.length - 1, Math.floor(f * (sorted.length - 1)))];
      const median = q(0.5);
      const mad = Math.max(q(0.5) * 0.02, [...sorted].map((v) => Math.abs(v - median)).sort((a, b) => a - b)[Math.floor(sorted.length / 2)]);
      lo = q(0.02);
      hi = median + 8 * mad;
      if (hi <= lo) hi = lo + 1e-9;
    }
    return {
      animation: false,
      grid: { ...GRID, top: 10 },
      tooltip: { formatter: (p) => tip(rows[p.value[1]], tipLine(null, `${fmtTime(buckets[p.value[0]])}: `, `${fmtNum(p.value[2], 4)} ${unit}`),
        p.value[3] === undefined ? null : tipLine(null, `${whoLabel}: `, String(p.value[3])),
        p.value[3] === undefined || REPORT ? null : el('div', { class: 'tip-summary' }, 'click: this row\'s ranks')) },
      xAxis: { type: 'category', data: buckets, axisLabel: { formatter: (v) => (data.range.bucket_ms < 60000 ? fmtTime(Number(v)) : fmtTime(Number(v)).slice(0, 5)), hideOverlap: true }, splitArea: { show: false } },
      yAxis: { type: 'category', data: rows, inverse: true, axisLabel: { fontSize: 10, hideOverlap: true, color: (v) => (RS.focusRows && RS.focusRows.has(v) ? '#d62728' : '#6e7079') } },
      // `dimension: 2`: the value. By default the last dimension is mapped, which on a grouped page is the
      // worst rank (every cell the hottest colour) or the least busy GPU's name (no cell drawn at all).
      // `precision`: the handles' labels as the legend's ends (at 0 decimals 1.3 s and 1.51 s read "1" and "2").
      visualMap: { type: 'continuous', dimension: 2, min: lo, max: hi, calculable: true, orient: 'vertical', right: 0, top: 'middle', itemHeight: 120,
        precision: fixedRange ? 0 : Math.min(6, Math.max(0, legendDigits(lo, hi) - 1 - Math.floor(Math.log10(Math.max(Math.abs(hi), 1e-12))))),
        text: legendText(lo, hi, unit, fixedRange), inRange: { color: fixedRange ? IDLE_IS_HOT : SLOW_IS_HOT } },
      dataZoom: [{ type: 'inside', xAxisIndex: 0, filterMode: 'none' }],
      series: [{ name, type: 'heatmap', data: points, progressive: 0, emphasis: { itemStyle: { borderColor: '#000', borderWidth: 1 } } }],
    };
  }

  const HOST_PANELS = [['cpu', 'Host CPU % (job\'s nodes)', '%'], ['mem_pct', 'Host memory used %', '%'], ['retrans', 'TCP retransmits / s', '/s'],
    ['net_gbps', 'Network throughput per node (Ethernet + InfiniBand, in + out)', 'Gb/s']];

  const HEATMAP_METRICS = [
    { key: 'compute', index: 2, label: 'compute time (forward + backward + optimizer)' },
    { key: 'step', index: 3, label: 'step time' },
    { key: 'comm', index: 4, label: 'communication time' },
    { key: 'wait', index: 5, label: 'data-loader wait' },
  ];

  // The job's time panels share one window; the compare charts (steps or tokens on x) do not.
  const timeCharts = () => Object.entries(RS.charts).filter(([k]) => !k.startsWith('compare_')).map(([, c]) => c);

  // The most rows a per-rank heatmap draws: the server groups a bigger job's ranks by node (`ui.rows`).
  const MAX_RANK_ROWS = 4096;

  function rankAxis(data) {
    // The rows of a per-rank heatmap: ranks 0 .. size-1, the job's size as it declared it (else as
    // many as it bound), never more than MAX_RANK_ROWS. A record may carry any rank (2,000,000,000):
    // cells outside the axis are counted, not drawn, and the rows are looked up by rank, not indexed.
    const bound = data.ranks.filter((r) => Number.isInteger(r.rank) && r.rank >= 0);
    const declared = data.job && Number.isInteger(data.job.world_size) && data.job.world_size > 0 ? data.job.world_size : 0;
    const size = Math.min(MAX_RANK_ROWS, declared || bound.reduce((m, r) => Math.max(m, r.rank + 1), 0));
    const byRank = new Map(bound.filter((r) => r.rank < size).map((r) => [r.rank, r]));
    const [times, ranks] = data.heatmap.cells;
    let top = -1;
    for (const r of byRank.keys()) top = Math.max(top, r);
    for (const r of ranks || []) if (Number.isInteger(r) && r >= 0 && r < size && r > top) top = r;
    const labels = [];
    const rowOf = new Map();
    for (let r = 0; r <= top; r++) {
      const b = byRank.get(r);
      rowOf.set(r, labels.length);
      labels.push(b ? `r${r} ${b.node}/${b.gpu_index ?? '?'}` : `r${r}`);
    }
    const rowIds = (ranks || []).map((r) => (rowOf.has(r) ? rowOf.get(r) : -1));
    const outside = new Set((ranks || []).filter((r) => !rowOf.has(r))).size;
    return { labels, rowOf, size, outside, cells: [times, rowIds, ...data.heatmap.cells.slice(2)] };
  }

  function renderJobCharts(container, data) {
    for (const [key, c] of Object.entries(RS.charts)) {
      if (key.startsWith('compare_') || key === 'history') continue;
      c.dispose();
      delete RS.charts[key];
    }
    container.replaceChildren();
    const buckets = bucketAxis(data);
    RS.buckets = buckets;
    // A big job's rows are nodes (or groups of nodes), a drill-down's its nodes' ranks (`heatmap.rows`).
    const rows = data.heatmap.rows || null;
    const axis = rows ? null : rankAxis(data);
    const rankLabels = rows ? rows.labels.slice() : axis.labels;
    const heatCells = rows ? data.heatmap.cells : axis.cells;
    const grouped = rows && rows.kind !== 'rank';
    const rankOption = (m) => heatmapOption(data, buckets, rankLabels, heatCells, m.index, m.label, 's', undefined, grouped && m.index < 4 ? m.index + 4 : undefined, 'worst rank');

    timeline(container, data);

    const metricSelect = el('select', { class: 'metric', onchange: (e) => {
      const m = HEATMAP_METRICS.find((x) => x.key === e.target.value);
      RS.charts.heatmap.setOption(rankOption(m), true);
      RS.heatmapMetric = m.key;
      applyFocus();
      applyWindow();
    } }, HEATMAP_METRICS.map((m) => el('option', { value: m.key }, m.label)));
    const outside = axis && axis.outside ? ` · ${axis.outside} rank ids outside the job's ${axis.size} ranks not drawn` : '';
    const heatTitle = !rows ? `Per-rank time per step (ranks × time): a straggler is a stripe${outside}`
      : grouped ? `Worst rank per ${rows.kind} (${rows.labels.length} rows of ${rows.ranks} ranks × time): a straggler is a stripe on its node's row; click a row for its ranks`
        : `Ranks of ${rows.drill.join(', ')} (${rows.labels.length} of ${rows.ranks}) × time`;
    const heat = chartBox(container, 'heatmap', heatTitle, Math.min(560, Math.max(200, rankLabels.length * HEAT_ROW_PX + 50)), metricSelect,
      rows && !REPORT ? drillLinks(data, rows) : null);
    heat.setOption(rankOption(HEATMAP_METRICS[0]));
    if (grouped && !REPORT) heat.on('click', (p) => { if (p.value) location.assign(drillHref(data, rows.nodes[p.value[1]])); });
    RS.heatmapMetric = 'compute';
    RS.rankLabels = rankLabels;
    RS.rankRow = axis ? axis.rowOf : null;
    RS.rows = rows;

    const seg = data.steps.segments;
    chartBox(container, 'segments', `Step segments, mean over ranks, seconds (${data.steps.segments_source === 'steps' ? 'from the step rows' : 'from the derived rank windows: compute = forward + backward + optimizer; zoom in for the split'})`, 190).setOption(timeOption(data,
      Object.keys(seg).map((k, i) => ({ name: k.replace('_', ' '), data: seg[k], stack: 'step', areaStyle: { opacity: 0.75 }, lineStyle: { width: 0 }, color: SEGMENT_COLORS[i] })), 's'));
    chartBox(container, 'throughput', 'Step time and steps per second', 170).setOption(timeOption(data, [
      { name: 'step time (s)', data: data.steps.step_time },
      { name: 'steps/s', data: data.steps.step_rate, yAxisIndex: 1, unit: 'steps/s' },
    ], 's', { yAxis: [{ type: 'value', name: 's', scale: true, splitNumber: 3 }, { type: 'value', name: 'steps/s', scale: true, splitNumber: 3 }], grid: GRID }));

    // A big job's GPU, host and loader panels come apart (`/details`): a note holds their place meanwhile.
    if (data.details === 'pending') container.append(el('p', { class: 'muted', id: 'details-pending' }, 'GPU, host and data-loader panels: reading every GPU, node and rank…'));
    const gpuLabels = data.gpus ? data.gpus.labels : [];
    if (gpuLabels.length) {
      // GPM (Hopper and newer): SM and tensor-pipe activity tell a spinning collective (busy, no tensor work) from compute.
      const gpm = data.gpm && (data.gpm.cells[0] || []).length ? data.gpm : null;
      const gpuMetrics = [
        { key: 'util', label: data.gpus.rows ? 'GPU activity (least busy GPU of the row)' : 'GPU activity', cells: data.gpus.cells, index: 2, who: data.gpus.rows ? 3 : undefined },
        ...(gpm ? [{ key: 'sm_active', label: 'SM active (GPM)', cells: gpm.cells, index: 2 }, { key: 'tensor_active', label: 'tensor pipes active (GPM)', cells: gpm.cells, index: 3 }] : []),
      ];
      const gpuOption = (m) => heatmapOption(data, buckets, gpuLabels, m.cells, m.index, m.label, '%', [0, 100], m.who, 'least busy GPU');
      const gpuSelect = gpm ? el('select', { class: 'metric', name: 'gpu-metric', onchange: (e) => {
        const m = gpuMetrics.find((x) => x.key === e.target.value);
        RS.charts.gpu_util.setOption(gpuOption(m), true);
        RS.gpuMetric = m.key;
        applyFocus();
        applyWindow();
      } }, gpuMetrics.map((m) => el('option', { value: m.key }, m.label))) : null;
      const gpuHeat = chartBox(container, 'gpu_util', `GPU activity % per GPU (${data.gpus.source})${gpm ? '; SM and tensor activity from GPM' : ''}`, Math.min(560, Math.max(200, gpuLabels.length * HEAT_ROW_PX + 50)), gpuSelect);
      gpuHeat.setOption(gpuOption(gpuMetrics[0]));
      RS.gpuMetric = 'util';
      for (const [key, title, unit] of [['power', 'GPU power (W): min / median / max over the job\'s GPUs', 'W'], ['sm_clock', 'SM clock (MHz)', 'MHz'], ['mem_used', 'GPU memory used (GiB)', 'GiB']]) {
        const bands = gpuBands(data, buckets, GPU_COLUMNS[key]);
        chartBox(container, `gpu_${key}`, title, 150).setOption(timeOption(data, [
          { name: 'median', data: bands.median, color: '#4c78a8' },
          { name: 'min', data: bands.min, color: '#9ecae9', lineStyle: { width: 1, type: 'dashed' } },
          { name: 'max', data: bands.max, color: '#9ecae9', lineStyle: { width: 1, type: 'dashed' } },
        ], unit));
      }
    }

    const nodes = data.hosts ? data.hosts.nodes : [];
    const hostBands = data.hosts && data.hosts.bands;
    for (const [key, title, unit] of data.hosts ? HOST_PANELS : []) {
      // Many nodes: min / median / max across them, and the lines of the nodes the alerts name.
      const series = nodes.map((n) => ({ name: n, data: data.hosts[key][n] || [] }));
      const bandSeries = hostBands ? [
        { name: 'median', data: hostBands[key].median, color: '#4c78a8' },
        { name: 'min', data: hostBands[key].min, color: '#9ecae9', lineStyle: { width: 1, type: 'dashed' } },
        { name: 'max', data: hostBands[key].max, color: '#9ecae9', lineStyle: { width: 1, type: 'dashed' } },
      ] : [];
      chartBox(container, `host_${key}`, hostBands ? `${title}: min / median / max over ${data.hosts.of} nodes` : title, 150).setOption(timeOption(data, [...bandSeries, ...series], unit));
    }

    const dl = data.dataloader;
    if (dl) chartBox(container, 'dataloader', 'Data loader: wait fraction (mean, worst rank) and queue depth', 160).setOption(timeOption(data, [
      { name: 'wait frac mean', data: dl.wait_frac_avg, unit: '' },
      { name: 'wait frac worst rank', data: dl.wait_frac_max.map((p) => [p[0], p[1]]), unit: '', lineStyle: { width: 1, type: 'dashed' } },
      { name: 'queue depth (mean)', data: dl.queue_depth_avg, yAxisIndex: 1, unit: 'batches' },
    ], 'frac', { yAxis: [{ type: 'value', name: 'frac', min: 0, splitNumber: 3 }, { type: 'value', name: 'queue', min: 0, splitNumber: 3 }], grid: GRID }));

    // The loader's own measurements: median rank and worst rank (the tooltip names it) per bucket.
    const dp = data.datapath;
    if (dp) {
      const scaled = (points, k) => points.map((p) => [p[0], p[1] === null ? null : p[1] * k, p[2]]);
      const worstLine = { lineStyle: { width: 1, type: 'dashed' } };
      const errors = dp.errors.reduce((n, e) => n + e[1], 0);
      const failedOpens = dp.errors.reduce((n, e) => n + e[2], 0);
      chartBox(container, 'datapath_latency', `Data path: storage read latency (ms) and batch preparation (s), median and worst rank${errors || failedOpens ? ` · ${errors} loader errors, ${failedOpens} failed opens` : ''}`, 160).setOption(timeOption(data, [
        { name: 'read latency median', data: scaled(dp.read_latency_s.median, 1000), unit: 'ms' },
        { name: 'read latency worst rank', data: scaled(dp.read_latency_s.worst, 1000), unit: 'ms', ...worstLine },
        { name: 'batch prep median', data: dp.batch_prep_s.median, yAxisIndex: 1, unit: 's' },
        { name: 'batch prep worst rank', data: dp.batch_prep_s.worst, yAxisIndex: 1, unit: 's', ...worstLine },
      ], 'ms', { yAxis: [{ type: 'value', name: 'ms', min: 0, splitNumber: 3 }, { type: 'value', name: 's', min: 0, splitNumber: 3 }], grid: GRID }));
      chartBox(container, 'datapath_supply', 'Data path: read throughput (MB/s) and file opens (/s) on the left axis; cache hit ratio and live loader workers (share) on the right; median and worst rank', 160).setOption(timeOption(data, [
        { name: 'read MB/s median', data: dp.read_mb_s.median, unit: 'MB/s' },
        { name: 'read MB/s worst rank', data: dp.read_mb_s.worst, unit: 'MB/s', ...worstLine },
        { name: 'cache hits median', data: dp.cache_hit_ratio.median, yAxisIndex: 1, unit: '' },
        { name: 'cache hits worst rank', data: dp.cache_hit_ratio.worst, yAxisIndex: 1, unit: '', ...worstLine },
        { name: 'live workers worst rank', data: dp.workers_live.worst, yAxisIndex: 1, unit: '', ...worstLine },
        { name: 'file opens/s median', data: dp.file_opens_s.median, unit: '/s', lineStyle: { width: 1, type: 'dotted' } },
      ], 'MB/s', { yAxis: [{ type: 'value', name: 'MB/s, opens/s', nameTextStyle: { align: 'left' }, min: 0, splitNumber: 3 }, { type: 'value', name: 'share', min: 0, max: 1, splitNumber: 2 }], grid: GRID }));
    }

    const ops = Object.keys(data.collectives || {});
    if (data.collectives) chartBox(container, 'collectives', 'Collectives: fraction of time in each op, bus bandwidth (GB/s)', 160).setOption(timeOption(data, [
      ...ops.map((op) => ({ name: `${op} time frac`, data: data.collectives[op].time_frac, unit: '' })),
      ...ops.map((op) => ({ name: `${op} GB/s`, data: data.collectives[op].bus_bw_gbps, yAxisIndex: 1, unit: 'GB/s', lineStyle: { width: 1, type: 'dotted' } })),
    ], 'frac', { yAxis: [{ type: 'value', name: 'frac', min: 0, splitNumber: 3 }, { type: 'value', name: 'GB/s', min: 0, splitNumber: 3 }], grid: GRID }));

    chartBox(container, 'loss', 'Loss (rank 0) and validation', 170).setOption(timeOption(data, [
      { name: 'loss', data: data.steps.loss, unit: '' },
      ...Object.entries(data.validation).map(([k, v]) => ({ name: `val ${k}`, unit: '', data: v.map((p) => [p[0], p[1]]), showSymbol: true, symbolSize: 6, lineStyle: { type: 'dashed' }, yAxisIndex: k.includes('loss') ? 0 : 1 })),
    ], 'loss', { yAxis: [{ type: 'value', name: 'loss', scale: true, splitNumber: 3 }, { type: 'value', name: 'other', scale: true, splitNumber: 3 }], grid: GRID }));
    chartBox(container, 'optim', 'Learning rate and gradient norm (rank 0)', 150).setOption(timeOption(data, [
      { name: 'grad norm', data: data.steps.grad_norm, unit: '' },
      { name: 'lr', data: data.steps.lr, yAxisIndex: 1, unit: '', lineStyle: { width: 1, type: 'dashed' } },
    ], 'grad norm', { yAxis: [{ type: 'value', name: 'grad', scale: true, splitNumber: 3 }, { type: 'value', name: 'lr', scale: true, splitNumber: 3, axisLabel: { formatter: (v) => Number(v).toExponential(1) } }], grid: GRID }));

    for (const chart of timeCharts()) {
      chart.on('datazoom', () => onZoom(chart));
    }
    window.addEventListener('resize', () => Object.values(RS.charts).forEach((c) => c.resize()));
  }

  function timeline(container, data) {
    // One lane per alert, then checkpoints, evaluations and job states; clicking an alert focuses it.
    const lanes = [];
    const items = [];
    const to = data.range.to_ms;
    data.alerts.forEach((a) => {
      lanes.push(`${a.rule} · ${where(a)}`);
      items.push({ value: [lanes.length - 1, a.starts_ms, a.status === 'resolved' && a.ends_ms ? a.ends_ms : to], alert: a, itemStyle: { color: a.status === 'firing' ? COLORS[a.severity] : COLORS.resolved } });
    });
    if (data.checkpoints.length) {
      lanes.push('checkpoints');
      data.checkpoints.forEach((c) => items.push({ value: [lanes.length - 1, c.start_ms, c.end_ms || to], label: `checkpoint ${c.id} (${c.status})`, itemStyle: { color: c.status === 'failed' || c.status === 'open' ? '#d62728' : '#5a78c8' } }));
    }
    if (data.evaluations.length) {
      lanes.push('evaluations');
      data.evaluations.forEach((e) => items.push({ value: [lanes.length - 1, e.start_ms, e.end_ms || to], label: `evaluation ${e.label || e.id} (${e.status})`, itemStyle: { color: '#3ca05a' } }));
    }
    if (data.states.length) {
      lanes.push('job state');
      data.states.forEach((s, i) => {
        const end = i + 1 < data.states.length ? data.states[i + 1].ts : to;
        items.push({ value: [lanes.length - 1, Math.max(s.ts, data.range.from_ms), end], label: `${s.state}${s.reason ? ` (${s.reason})` : ''}`, itemStyle: { color: s.state === 'running' ? '#c7e9c0' : '#fdae6b' } });
      });
    }
    if (!lanes.length) lanes.push('no alerts, checkpoints or evaluations');
    RS.timelineItems = items;
    const chart = chartBox(container, 'timeline', 'Alerts, checkpoints, evaluations and job state (click an alert to zoom to it)', Math.max(90, lanes.length * 22 + 40));
    chart.setOption({
      animation: false,
      grid: { ...GRID, top: 6 },
      tooltip: { formatter: (p) => {
        const a = p.data.alert;
        const span = tipLine(null, `${fmtTime(p.value[1])} → ${fmtTime(p.value[2])}`);
        return a ? tip(a.rule, tipLine(COLORS[a.status === 'firing' ? a.severity : 'resolved'], `${a.severity} · ${a.status} · ${where(a)}`), el('div', { class: 'tip-summary' }, a.summary), a.resolution ? el('div', { class: 'tip-summary resolution' }, a.resolution) : null, span)
          : tip(p.data.label, span);
      } },
      xAxis: { type: 'time', min: data.range.from_ms, max: data.range.to_ms, axisLabel: { formatter: (v) => fmtTime(v).slice(0, 5), hideOverlap: true } },
      yAxis: { type: 'category', data: lanes, inverse: true, axisLabel: { fontSize: 11, width: GRID.left - 12, overflow: 'truncate' } },
      dataZoom: [{ type: 'inside', xAxisIndex: 0, filterMode: 'none' }],
      series: [{
        type: 'custom', data: items, encode: { x: [1, 2], y: 0 },
        renderItem: (params, api) => {
          const start = api.coord([api.value(1), api.value(0)]);
          const end = api.coord([api.value(2), api.value(0)]);
          const h = api.size([0, 1])[1] * 0.6;
          const rect = echarts.graphic.clipRectByRect({ x: start[0], y: start[1] - h / 2, width: Math.max(end[0] - start[0], 2), height: h },
            { x: params.coordSys.x, y: params.coordSys.y, width: params.coordSys.width, height: params.coordSys.height });
          return rect && { type: 'rect', shape: rect, style: api.style() };
        },
      }],
    });
    chart.on('click', (p) => { if (p.data && p.data.alert) focusAlert(p.data.alert); });
  }

  // --- shared window and focus --------------------------------------------------------------------

  function isCategory(chart) {
    // From the axis model, not getOption(): that deep-copies every series' data (61k cells at 512 ranks).
    return chart.getModel().getComponent('xAxis', 0).axis.type === 'category';
  }

  function onZoom(chart) {
    if (RS.syncing) return;
    const axis = chart.getModel().getComponent('xAxis', 0).axis;
    let [lo, hi] = axis.scale.getExtent();
    if (isCategory(chart)) {
      lo = RS.buckets[Math.max(0, Math.round(lo))];
      hi = RS.buckets[Math.min(RS.buckets.length - 1, Math.round(hi))] + RS.data.range.bucket_ms;
    }
    setWindow(lo, hi, chart);
  }

  function setWindow(t0, t1, source) {
    const range = (RS.data.evidence || RS.data).range;
    t0 = Math.max(range.from_ms, Math.round(t0));
    t1 = Math.min(range.to_ms, Math.round(t1));
    RS.window = [t0, t1];
    RS.syncing = true;
    try {
      for (const chart of timeCharts()) {
        if (chart === source || chart.isDisposed()) continue;
        if (isCategory(chart)) {
          const width = range.bucket_ms;
          const i0 = Math.max(0, Math.floor((t0 - range.from_ms) / width));
          const i1 = Math.min(RS.buckets.length - 1, Math.max(i0, Math.ceil((t1 - range.from_ms) / width) - 1));
          chart.dispatchAction({ type: 'dataZoom', startValue: i0, endValue: i1 });
        } else {
          chart.dispatchAction({ type: 'dataZoom', startValue: t0, endValue: t1 });
        }
      }
    } finally {
      RS.syncing = false;
    }
    const label = document.getElementById('window-label');
    if (label) label.textContent = `${fmtDateTime(t0)} → ${fmtTime(t1)} (${fmtDuration(t1 - t0)})`;
    const link = document.getElementById('window-link');
    const job = (RS.data.evidence || RS.data).job;
    if (link && job) {
      link.href = `/jobs/${encodeURIComponent(job.job_id)}?from=${t0}&to=${t1}`;
      link.hidden = false;
    }
  }

  function applyWindow() {
    if (RS.window) setWindow(RS.window[0], RS.window[1], null);
  }

  function focusAlert(a) {
    const range = (RS.data.evidence || RS.data).range;
    const end = a.status === 'resolved' && a.ends_ms ? a.ends_ms : range.to_ms;
    const margin = Math.max(2 * range.bucket_ms, (end - a.starts_ms) * 0.25);
    RS.focus = { alert_id: a.alert_id, rank: a.rank ?? null, node: a.node || null, gpu_index: a.gpu_index ?? null };
    applyFocus();
    setWindow(a.starts_ms - margin, end + margin, null);
    document.querySelectorAll('tr[data-alert]').forEach((tr) => tr.classList.toggle('focused', tr.dataset.alert === a.alert_id));
    const label = document.getElementById('focus-label');
    if (label) label.textContent = `focus: ${a.rule} · ${where(a)}`;
  }

  function focusRow(f) {
    // The heatmap row of a focused alert: its rank's row, or on a grouped page the row of its node.
    const rows = RS.rows;
    if (!rows) return f.rank !== null && RS.rankRow.has(f.rank) ? RS.rankLabels[RS.rankRow.get(f.rank)] : undefined;
    if (rows.kind === 'rank') return f.rank === null ? undefined : RS.rankLabels.find((l) => l.startsWith(`r${f.rank} `));
    const i = rows.nodes.findIndex((ns) => ns.includes(f.node));
    return i >= 0 ? RS.rankLabels[i] : undefined;
  }

  function drillHref(data, nodes) {
    // The same page (and time range) drilled down to these nodes' ranks.
    const params = new URLSearchParams(location.search);
    params.delete('node');
    for (const n of nodes) params.append('node', n);
    return `/jobs/${encodeURIComponent(data.job.job_id)}?${params}`;
  }

  function drillLinks(data, rows) {
    // Under a grouped heatmap: how to drill down; on a drill-down: the way back to every node.
    if (rows.kind !== 'rank') return el('p', { class: 'muted drill' }, `${rows.ranks} ranks on ${rows.nodes.reduce((n, r) => n + r.length, 0)} nodes: each cell is the row's slowest window (the tooltip names its rank); click a row to see its ranks.`);
    const params = new URLSearchParams(location.search);
    params.delete('node');
    const back = `/jobs/${encodeURIComponent(data.job.job_id)}${params.toString() ? `?${params}` : ''}`;
    return el('p', { class: 'drill' }, `Drill-down: the ranks of ${rows.drill.join(', ')}. `, el('a', { href: back, id: 'drill-up' }, 'all nodes'));
  }

  function rowMark(rows, row) {
    // A frame around the row (category bands: from the centre of the row above to the one below).
    const i = rows.indexOf(row);
    const above = rows[Math.max(0, i - 1)];
    const below = rows[Math.min(rows.length - 1, i + 1)];
    return { silent: true, itemStyle: { color: 'rgba(0,0,0,0)', borderColor: '#d62728', borderWidth: 2, borderType: 'dashed' }, data: [[{ yAxis: above }, { yAxis: below }]] };
  }

  function applyFocus() {
    const f = RS.focus;
    const data = RS.data.evidence || RS.data;
    if (!f) return;
    RS.focusRows = new Set();
    const rankRow = focusRow(f);
    if (RS.charts.heatmap && rankRow !== undefined) {
      RS.focusRows.add(rankRow);
      RS.charts.heatmap.setOption({ series: [{ markArea: rowMark(RS.rankLabels, rankRow) }] });
    }
    const gpus = data.gpus || { keys: [], labels: [] };
    const gpuKeys = gpus.rows ? gpus.named.keys : gpus.keys;
    const gpuIndex = gpuKeys.findIndex((k) => k[0] === f.node && k[1] === f.gpu_index);
    if (gpus.rows && rankRow !== undefined && RS.charts.gpu_util) {
      RS.charts.gpu_util.setOption({ series: [{ markArea: rowMark(data.gpus.labels, rankRow) }] });
    }
    if (gpuIndex >= 0) {
      const label = data.gpus.rows ? `${f.node}/gpu${f.gpu_index}` : data.gpus.labels[gpuIndex];
      RS.focusRows.add(label);
      if (!data.gpus.rows) RS.charts.gpu_util && RS.charts.gpu_util.setOption({ series: [{ markArea: rowMark(data.gpus.labels, label) }] });
      for (const key of ['power', 'sm_clock', 'mem_used']) {
        const chart = RS.charts[`gpu_${key}`];
        if (!chart) continue;
        const series = chart.getOption().series.filter((s) => !String(s.name).startsWith('GPU '));
        series.push({ name: `GPU ${label}`, type: 'line', showSymbol: false, color: '#d62728', lineStyle: { width: 2 }, data: gpuSeries(data, RS.buckets, gpuIndex, GPU_COLUMNS[key]) });
        chart.setOption({ series }, { replaceMerge: ['series'] });
      }
    }
    if (f.node) {
      for (const key of ['cpu', 'mem_pct', 'retrans', 'net_gbps']) {
        const chart = RS.charts[`host_${key}`];
        if (!chart) continue;
        chart.setOption({ series: chart.getOption().series.map((s) => ({ name: s.name, lineStyle: { width: s.name === f.node ? 3 : 1, opacity: s.name === f.node ? 1 : 0.35 } })) });
      }
    }
  }

  // --- job and alert pages ------------------------------------------------------------------------

  function jobHeader(data) {
    const j = data.job;
    // Muted alerts (`muted_by`) are not counted as firing, as in the fleet's counts; the badge says how many.
    const all = data.alerts.filter((a) => a.status === 'firing');
    const firing = all.filter((a) => !a.muted_by).sort((a, b) => SEVERITY_ORDER[a.severity] - SEVERITY_ORDER[b.severity]);
    const muted = all.length - firing.length ? ` (${all.length - firing.length} muted)` : '';
    return el('div', { class: 'header' },
      el('h1', {}, REPORT ? '' : el('a', { href: '/', class: 'crumb' }, 'fleet › '), `job ${j.job_id}`,
        firing.length ? badge(firing[0].severity, `${firing.length} firing${muted}`) : el('span', { class: 'badge ok' }, `no alert firing${muted}`),
        conditionBadge(data.condition)),
      el('dl', { class: 'facts' },
        ...[['team', j.team], ['owner', j.owner], ['cluster', j.cluster], ['model', j.model], ['ranks', j.world_size], ['GPU', j.gpu_class],
          ['nodes', (j.nodes || []).length > 8 ? `${j.nodes.length} nodes: ${j.nodes[0]} … ${j.nodes[j.nodes.length - 1]}` : (j.nodes || []).join(', ')], ['run', j.run_id], ['started', fmtDateTime(j.started_ms)],
          ['state', data.states.length ? data.states[data.states.length - 1].state : '-'],
          ...(j.image ? [['image', j.image]] : []), ...(j.workspace ? [['workspace', j.workspace]] : [])]
          .map(([k, v]) => factPair(k, v))),
      progressFacts(data),
      REPORT ? null : el('p', {}, el('a', { href: `/reports/jobs/${encodeURIComponent(j.job_id)}` }, 'download a self-contained report of this job'),
        ' · ', el('a', { href: `/compare?job=${encodeURIComponent(j.job_id)}`, id: 'compare-link' }, j.workload_family ? 'compare with other runs of this workload family' : 'compare its runs'),
        ' · ', el('a', { href: `/history?job=${encodeURIComponent(j.job_id)}`, id: 'history-link' }, 'every alert of this job')));
  }

  // What a job is doing now (`ui.facts.job_condition`): a state that stops it wins over its averages.
  function conditionText(c) {
    if (!c || c.kind === 'running') return null;
    if (c.kind === 'finished') return `${c.state}${c.since_ms ? `, last step ${fmtDateTime(c.since_ms)}` : ''}`;
    const since = c.since_ms ? ` since ${fmtDateTime(c.since_ms)}` : '';
    if (c.kind === 'overdue') return `no step${since} (progress heartbeat overdue)`;
    return `${c.kind}${since}${c.rule ? ` (${c.rule} firing)` : ''}`;
  }
  function conditionBadge(c) {
    const text = conditionText(c);
    if (!text) return null;
    return el('span', { class: `badge ${c.kind === 'finished' ? 'ok' : 'critical'}`, id: 'job-condition' }, text);
  }

  function alertProgress(a) {
    // The run's target, how much of it was done and the ETA at the recent step rate, as the alert
    // carries them (schemas.progress.estimate: the job page's arithmetic, at the alert's time).
    if (a.target_kind === null || a.target_kind === undefined) return 'no target known (JobStarted carries none)';
    if (a.target_done === null || a.target_done === undefined) return `target ${fmtCompact(a.target)} ${a.target_kind}, no step yet`;
    const share = a.target > 0 ? ` (${fmtFixed((100 * a.target_done) / a.target, 1)} %)` : '';
    const done = `${fmtCompact(a.target_done)} of ${fmtCompact(a.target)} ${a.target_kind}${share}`;
    // A firing stall or hang stops the job: an ETA at the rate before it would be a promise it cannot keep.
    if (a.status === 'firing' && ['job_stall', 'zombie_job', 'rank_hang'].includes(a.rule)) return `${done}; no ETA: ${a.rule === 'rank_hang' ? 'hung' : 'stalled'} since ${fmtDateTime(a.last_progress_ts ?? a.starts_ms)}`;
    if (a.eta_s === null || a.eta_s === undefined) return `${done}; no ETA (no recent steps, or the job ended)`;
    const finish = a.last_progress_ts ? `, done about ${fmtDateTime(a.last_progress_ts + a.eta_s * 1000)}` : '';
    return `${done}; ETA ${fmtDuration(a.eta_s * 1000)} at the recent step rate${finish}`;
  }

  function progressFacts(data) {
    // Progress towards the target and the ETA (sinks.progress.estimate), the checkpoint a restart would use.
    const p = data.progress;
    const c = data.checkpoint;
    if (!p && !c) return null;
    const facts = [];
    if (p) {
      facts.push(['progress', p.target_kind === null ? 'no target known (JobStarted carries none)'
        : p.done === null ? `target ${fmtCompact(p.target)} ${p.target_kind}, no step yet`
          : `${fmtCompact(p.done)} of ${fmtCompact(p.target)} ${p.target_kind} (${fmtFixed(100 * p.fraction, 1)} %)`]);
      const stopped = data.condition && ['stalled', 'hung', 'overdue'].includes(data.condition.kind) ? conditionText(data.condition) : null;
      facts.push(['ETA', stopped ? `none: ${stopped}` : p.eta_s === null ? (p.state === 'completed' || p.state === 'failed' ? `none: ${p.state}` : '— (no target or no recent steps)')
        : `${fmtDuration(p.eta_s * 1000)}, done ${fmtDateTime(p.finish_ms)} at ${fmtNum(p.rate_steps_s)} steps/s`]);
    }
    if (c) {
      const v = c.last_verified;
      facts.push(['last verified checkpoint', v ? `${v.id} (step ${v.step}), ${fmtDuration(c.verified_age_s * 1000)} old${c.stale ? ` — stale: policy ${fmtDuration(c.max_age_s * 1000)}` : ''}` : 'none verified']);
      facts.push(['last checkpoint', c.last_completed ? `${c.last_completed.id} (step ${c.last_completed.step}) at ${fmtDateTime(c.last_completed.ts)}` : 'none completed']);
      facts.push(['retention', `${c.retention_keep === null ? 'keep: unknown' : `keeps the newest ${c.retention_keep}`}; ${c.deleted.length} deleted${c.verified_deleted ? ' — including the latest verified one' : ''}${c.failed || c.verify_failed ? `; ${c.failed} failed, ${c.verify_failed} failed verification` : ''}`]);
    }
    return el('dl', { class: 'facts', id: 'job-progress' }, ...facts.map(([k, v]) => factPair(k, v)));
  }

  function faultsPanel(data) {
    // Rank faults (exceptions, exits, CUDA OOM) and GPU faults (XID events, uncorrected ECC) in the range.
    const f = data.faults;
    if (!f || (!f.ranks.length && !f.gpus.length)) return el('p', { class: 'muted', id: 'faults' }, 'No rank or GPU fault in this range.');
    return el('div', { id: 'faults' }, el('h2', {}, `Faults (${f.ranks.length} rank, ${f.gpus.length} GPU)`),
      f.ranks.length ? el('table', { class: 'grid rank-faults' },
        el('thead', {}, el('tr', {}, ['when', 'rank', 'node', 'kind', 'exit code', 'detail'].map((h) => el('th', {}, h)))),
        el('tbody', {}, f.ranks.map((x) => el('tr', { 'data-rank': x.rank, 'data-kind': x.kind },
          el('td', { class: 'nowrap' }, fmtDateTime(x.ts)), el('td', { class: 'num' }, x.rank), el('td', {}, x.node || '-'), el('td', {}, x.kind),
          el('td', { class: 'num' }, x.exit_code ?? '-'), el('td', { class: 'summary' }, x.detail || '-'))))) : null,
      f.gpus.length ? el('table', { class: 'grid gpu-faults' },
        el('thead', {}, el('tr', {}, ['GPU', 'XIDs', 'XID samples', 'uncorrected ECC', 'first', 'last'].map((h) => el('th', {}, h)))),
        el('tbody', {}, f.gpus.map((x) => el('tr', { 'data-gpu': `${x.node}/${x.gpu_index}` },
          el('td', {}, `${x.node}/gpu${x.gpu_index}`), el('td', {}, x.xids.join(', ') || '-'), el('td', { class: 'num' }, x.xid_samples),
          el('td', { class: 'num' }, x.ecc_uncorrected ?? '-'), el('td', { class: 'nowrap' }, fmtDateTime(x.first_ms)), el('td', { class: 'nowrap' }, fmtDateTime(x.last_ms)))))) : null);
  }

  // Where the allocated GPU-hours went (docs/efficiency.md), then the queue wait (GPUs asked for, not allocated).
  const SPENT = [['productive', '#54a24b'], ['stall', '#e45756'], ['restart', '#b279a2'], ['skipped', '#9d755d'], ['checkpoint', '#4c78a8'], ['evaluation', '#72b7b2']];

  function spentBar(spent, allocated, queue) {
    const known = SPENT.reduce((sum, [k]) => sum + (spent[k] || 0), 0);
    const parts = [...SPENT.map(([k, color]) => [k, spent[k] || 0, color]), ['other', allocated - known > 1e-3 * allocated ? allocated - known : 0, '#c7c7c7']];
    const total = Math.max(allocated, known) + (queue || 0);
    const seg = (name, value, color, cls) => (value > 0 && total > 0
      ? el('span', { class: `seg ${cls || ''}`, 'data-part': name, style: `width:${(100 * value / total).toFixed(3)}%;background:${color}`, title: `${name}: ${fmtNum(value)} GPU-h (${fmtFixed(100 * value / (allocated || 1), 1)} % of allocated)` })
      : null);
    return [
      el('div', { class: 'stack' }, parts.map(([k, v, c]) => seg(k, v, c)), seg('queue', queue || 0, '#fff', 'queue')),
      el('div', { class: 'legend' }, [...parts, ['queue (waited, not allocated)', queue || 0, '#fff']].filter(([, v]) => v > 0)
        .map(([k, v, c]) => el('span', {}, el('i', { style: `background:${c}`, class: k.startsWith('queue') ? 'queue' : '' }), `${k} ${fmtNum(v)} GPU-h`))),
    ];
  }

  async function loadEfficiency(jobId) {
    // The served job page gets its efficiency panel apart (`/api/jobs/<job>/efficiency`, cached by the server).
    try {
      RS.efficiency = { job: jobId, data: await getJSON(`/api/jobs/${encodeURIComponent(jobId)}/efficiency`) };
    } catch (err) {
      RS.efficiency = { job: jobId, error: err.message };
    }
    const old = document.getElementById('efficiency');
    if (old && RS.data && RS.data.job && RS.data.job.job_id === jobId) old.replaceWith(efficiencyPanel(RS.data));
    RS.efficiencyReady = true;
  }

  function efficiencyPanel(data) {
    let e = data.efficiency;
    if (e === undefined) {
      const known = RS.efficiency && RS.efficiency.job === data.job.job_id ? RS.efficiency : null;
      if (!known) return el('p', { class: 'muted', id: 'efficiency' }, 'Efficiency: computing…');
      if (known.error) return el('p', { class: 'muted', id: 'efficiency' }, `Efficiency: ${known.error}`);
      e = known.data;
    }
    if (!e) return el('p', { class: 'muted', id: 'efficiency' }, 'No run of this job is recorded yet: no efficiency figures.');
    const money = (v) => (v === null || v === undefined ? 'no price configured' : `$${fmtFixed(v, 2)}`);
    const figure = (key, label, text, title) => [el('div', { class: 'fact' }, el('dt', { title }, label), el('dd', { 'data-figure': key, 'data-value': e[key] ?? '' }, text))];
    const perBillion = (v) => (v === null || v === undefined || v === 0 ? '—' : fmtNum(v));
    // No GPU energy counter read during the run sums to 0: that is nothing measured, not zero energy.
    const kwh = (v) => (v === null || v === undefined || v === 0 ? 'not measured' : `${fmtNum(v)} kWh`);
    return el('section', { class: 'panel efficiency', id: 'efficiency' },
      el('h3', {}, `Efficiency: ${e.runs} run${e.runs === 1 ? '' : 's'}, ${e.gpus} × ${e.gpu_class || 'GPU'}, ${e.outcome}${e.outcome === 'running' ? ' (figures move until the run ends)' : ''}`),
      spentBar(e.spent_gpu_h, e.allocated_gpu_h, e.queue_gpu_h),
      el('dl', { class: 'facts' },
        ...figure('allocated_gpu_h', 'allocated GPU-hours', fmtFixed(e.allocated_gpu_h, 2)),
        ...figure('goodput_pct', 'goodput', `${fmtFixed(e.goodput_pct, 1)} %`, 'productive GPU-hours / allocated GPU-hours'),
        ...figure('tokens_per_gpu_h', 'tokens per GPU-hour', fmtCompact(e.tokens_per_gpu_h)),
        ...figure('samples_per_gpu_h', 'samples per GPU-hour', fmtCompact(e.samples_per_gpu_h)),
        ...figure('energy_kwh', 'energy', kwh(e.energy_kwh), 'from the GPUs\' energy counters'),
        ...figure('kwh_per_billion_tokens', 'kWh per billion tokens', perBillion(e.kwh_per_billion_tokens)),
        ...figure('queue_s', 'queue wait', e.queue_s === null ? 'unknown' : fmtDuration(e.queue_s * 1000)),
        ...figure('failed_work_pct', 'failed work', `${fmtFixed(e.failed_work_pct, 1)} %`, 'GPU-hours of failed runs after their last verified checkpoint, of allocated'),
        ...figure('cost', 'cost', e.cost === null ? money(null) : `${money(e.cost)} at $${fmtFixed(e.price_per_gpu_h, 2)}/GPU-h`),
        ...figure('cost_per_successful_run', 'cost per successful run', e.cost === null ? money(null) : e.cost_per_successful_run === null ? '— (no run completed)' : money(e.cost_per_successful_run))),
      e.per_run.length > 1 ? el('table', { class: 'grid runs' },
        el('thead', {}, el('tr', {}, ['run', 'outcome', 'GPUs', 'GPU-h', 'where they went', 'goodput', 'tokens/GPU-h', 'kWh', 'kWh/Btok', 'cost'].map((h) => el('th', {}, h)))),
        el('tbody', {}, e.per_run.map((r) => el('tr', { 'data-run': r.run_id },
          el('td', {}, r.run_id), el('td', {}, r.outcome), el('td', { class: 'num' }, r.gpus), el('td', { class: 'num' }, fmtFixed(r.allocated_gpu_h, 2)),
          el('td', { class: 'bar' }, spentBar(r.spent_gpu_h, r.allocated_gpu_h, 0)[0]),
          el('td', { class: 'num' }, `${fmtFixed(r.goodput_pct, 1)} %`), el('td', { class: 'num' }, fmtCompact(r.tokens_per_gpu_h)),
          el('td', { class: 'num' }, r.energy_kwh ? fmtNum(r.energy_kwh) : '—'), el('td', { class: 'num' }, perBillion(r.kwh_per_billion_tokens)),
          el('td', { class: 'num' }, r.cost === null ? '—' : money(r.cost)))))) : null);
  }

  function alertList(data) {
    if (!data.alerts.length) return el('p', { class: 'muted' }, 'No alerts in this range.');
    const sorted = [...data.alerts].sort((a, b) => (a.status === b.status ? 0 : a.status === 'firing' ? -1 : 1) || SEVERITY_ORDER[a.severity] - SEVERITY_ORDER[b.severity] || a.starts_ms - b.starts_ms);
    // A muted alert is listed under its cause, as on the fleet page.
    return el('table', { class: 'grid alerts' },
      el('thead', {}, el('tr', {}, ['', 'severity', 'status', 'rule', 'where', 'team', 'since', 'until', 'suspected layer', 'summary', ''].map((h) => el('th', {}, h)))),
      el('tbody', {}, folded(sorted).map(([a, cause]) => el('tr', { 'data-alert': a.alert_id, 'data-muted-by': a.muted_by ? a.muted_by.alert_id : null, class: `clickable row-${a.status}${a.muted_by ? ' row-muted' : ''}`, onclick: () => focusAlert(a), title: 'zoom every panel to this alert' },
        el('td', {}, cause ? el('span', { class: 'fold' }, '↳ ') : null, el('button', { class: 'zoom' }, 'zoom')),
        el('td', {}, badge(a.muted_by ? 'muted' : a.severity, a.severity)), el('td', {}, a.muted_by ? `${a.status}, muted` : a.status), el('td', {}, a.rule), el('td', { class: 'nowrap' }, where(a)), el('td', {}, copiesCell(a)),
        el('td', { class: 'nowrap' }, fmtTime(a.starts_ms)), el('td', { class: 'nowrap' }, a.status === 'resolved' ? fmtTime(a.ends_ms) : 'firing'),
        el('td', {}, a.suspected_layer), el('td', { class: 'summary' }, a.muted_by ? el('div', { class: 'muted-by' }, mutedText(a)) : null, a.summary, a.resolution ? el('div', { class: 'resolution' }, a.resolution) : null),
        el('td', {}, el('a', { href: alertHref(a), onclick: (e) => e.stopPropagation() }, 'details'))))));
  }

  function actionsPanel(actions, id) {
    // Remediation decisions (ActionTaken): what was done or would have been, by which scheduler, and why.
    if (!actions || !actions.length) return el('p', { class: 'muted', id }, 'Remediation: no decision recorded.');
    return el('div', { id }, el('h2', {}, `Remediation (${actions.length})`),
      el('table', { class: 'grid actions' },
        el('thead', {}, el('tr', {}, ['when', 'alert', 'action', 'decision', 'reason', 'scheduler', 'target', 'checkpoint age', 'answer'].map((h) => el('th', {}, h)))),
        el('tbody', {}, actions.map((x) => el('tr', { 'data-action': x.action_id, 'data-decision': x.decision },
          el('td', { class: 'nowrap' }, fmtDateTime(x.ts)),
          el('td', {}, x.alert_id ? el('a', { href: alertHref(x) }, x.rule || x.alert_id) : x.rule),
          el('td', {}, x.action), el('td', {}, el('strong', {}, x.decision), x.dry_run && x.decision !== 'dry_run' ? ' (dry run)' : null),
          el('td', { class: 'summary' }, x.reason, x.reason_code ? el('div', { class: 'muted' }, x.reason_code) : null),
          el('td', {}, x.scheduler), el('td', {}, x.target),
          el('td', { class: 'nowrap' }, x.checkpoint_age_s === null || x.checkpoint_age_s === undefined ? '-' : fmtDuration(x.checkpoint_age_s * 1000)),
          el('td', { class: 'summary' }, x.detail || '-'))))));
  }

  function toolbar(data) {
    return el('div', { class: 'toolbar sticky' },
      el('button', { onclick: () => { RS.focus = null; renderJobCharts(document.getElementById('charts'), RS.data.evidence || RS.data); RS.window = null; document.getElementById('window-label').textContent = 'whole range'; } }, 'reset zoom'),
      el('span', { id: 'window-label' }, 'whole range'),
      el('span', { id: 'focus-label', class: 'focus' }, ''),
      REPORT ? null : el('a', { id: 'window-link', href: '#', hidden: true, title: 'the page keeps the buckets of the whole range; this link re-reads the window at its own resolution' }, 'open this window at full resolution'),
      REPORT ? null : rangePicker(data),
      el('span', { class: 'muted' }, `bucket ${fmtDuration(data.range.bucket_ms)} · heatmap from ${data.heatmap.source}${data.gpus && data.gpus.source ? ` · GPUs from ${data.gpus.source}` : ''} · scroll or pinch on any panel to zoom`));
  }

  // The time range a job page reads (?from=&to=, UTC ms): the last minutes of the job's data, or two
  // instants typed in UTC. The page re-reads at the range's own resolution; drill-down nodes are kept.
  const RANGE_PRESETS = [['whole run', null], ['last 15 min', 15], ['last hour', 60], ['last 6 hours', 360], ['last 24 hours', 1440]];
  function rangeHref(from, to) {
    const params = new URLSearchParams(location.search);
    params.delete('from');
    params.delete('to');
    if (from !== null) { params.set('from', String(Math.round(from))); params.set('to', String(Math.round(to))); }
    return `${location.pathname}${params.toString() ? `?${params}` : ''}`;
  }
  function rangePicker(data) {
    const end = data.range.span ? data.range.span[1] : data.range.to_ms;
    const start = data.range.span ? data.range.span[0] : data.range.from_ms;
    const from = utcField('range-from', data.range.from_ms, 'from');
    const to = utcField('range-to', data.range.to_ms, 'to');
    const preset = el('select', { name: 'range-preset', onchange: (e) => {
      const minutes = RANGE_PRESETS[Number(e.target.value)][1];
      location.assign(minutes === null ? rangeHref(null) : rangeHref(Math.max(start, end - minutes * 60000), end + 1));
    } }, el('option', { value: '', disabled: true, selected: true }, 'range…'), RANGE_PRESETS.map(([label], i) => el('option', { value: String(i) }, label)));
    const apply = el('button', { name: 'range-apply', onclick: () => {
      const a = readUtc(from);
      const b = a === undefined ? undefined : readUtc(to);
      if (a === undefined || b === undefined) return; // not a time: the field says how to write one
      if (a === null || b === null || b <= a) {
        (a === null ? from : to).setCustomValidity(a === null || b === null ? `Write both times in UTC as ${UTC_FORMAT}.` : 'The end must come after the start.');
        (a === null ? from : to).reportValidity();
        return;
      }
      location.assign(rangeHref(a, b));
    } }, 'show');
    return el('span', { class: 'range', id: 'range-picker' }, preset, from, '–', to, el('span', { class: 'muted' }, 'UTC'), apply);
  }

  async function loadDetails(data) {
    // A big job's GPU, host and loader panels, read apart over the page's own range, then drawn in place.
    const params = new URLSearchParams({ from: data.range.from_ms, to: data.range.to_ms });
    for (const n of (data.heatmap.rows && data.heatmap.rows.drill) || []) params.append('node', n);
    try {
      const details = await getJSON(`/api/jobs/${encodeURIComponent(data.job.job_id)}/details?${params}`);
      delete details.range;
      if ((RS.data.evidence || RS.data) !== data) return; // the page moved on
      Object.assign(data, details);
      delete data.details;
      renderJobCharts(document.getElementById('charts'), data);
      if (RS.focus) applyFocus();
      applyWindow();
    } catch (err) {
      const note = document.getElementById('details-pending');
      if (note) note.textContent = `GPU, host and data-loader panels: ${err.message}`;
    }
    RS.detailsReady = true;
  }

  function renderJob(root, data) {
    RS.data = data;
    root.replaceChildren(jobHeader(data), efficiencyPanel(data), el('h2', {}, 'Alerts'), alertList(data), actionsPanel(data.actions, 'actions'), faultsPanel(data), toolbar(data), el('div', { id: 'charts' }));
    renderJobCharts(document.getElementById('charts'), data);
    if (data.efficiency === undefined && !REPORT) loadEfficiency(data.job.job_id);
    if (data.details === 'pending' && !REPORT) loadDetails(data);
    // A report carries the comparison with the runs of the job's workload family; the served page links it.
    if (data.compare) renderCompare(root, data.compare, root);
    RS.ready = true;
  }

  // The unit of a detector's metric, from its name (the detectors' naming: *_s seconds, *_pct %, ...).
  const COUNT_METRICS = new Set(['restarts', 'failed_checkpoints', 'failed_verifications', 'foreign_pids', 'failed_restore_tests',
    'unverified_newer_checkpoints', 'ranks_timed_out', 'loader_errors', 'rank_faults', 'ranks_outside_nodes', 'ecc_uncorrected']);
  function metricUnit(name) {
    const n = String(name || '');
    if (COUNT_METRICS.has(n)) return 'count';
    if (n === 'step' || n.startsWith('steps_')) return 'steps';
    if (n === 'xid') return 'XID code';
    if (/(^|_)s$|^seconds_/.test(n)) return 's';
    if (/_pct$/.test(n)) return '%';
    if (/_gib$/.test(n)) return 'GiB';
    if (/_w$/.test(n)) return 'W';
    if (/_mhz$/.test(n)) return 'MHz';
    if (/_per_s_per_gpu$/.test(n)) return `${n.split('_per_s')[0]}/s per GPU`;
    if (/(ratio|fraction|score)$/.test(n)) return 'ratio';
    return '';
  }
  // A value with its own unit, as the alert record typed it (`observed_unit`, `expected_unit`): a
  // share (`ratio`) reads in %, a step number as "step N". Null: a record written before alerts carried
  // units; the number is shown bare and says so, never with another value's unit.
  function valueText(v, unit) {
    if (v === null || v === undefined) return '-';
    if (unit === null || unit === undefined) return `${fmtNum(v, 4)} (unit not recorded)`;
    if (unit === 'ratio') return `${fmtNum(v * 100, 3)} %`;
    if (unit === 'step') return `step ${Math.round(v)}`;
    if (unit === 'steps') return `${Math.round(v)} steps`;
    if (unit === 'count' || unit === '') return fmtNum(v, 4);
    return `${fmtNum(v, 4)} ${unit}`;
  }
  const valueFact = (v, unit, what) => (v === null || v === undefined ? '-' : `${valueText(v, unit)}${what ? ` (${what})` : ''}`);
  // Rules whose metric is a progress counter while their threshold is a time without progress.
  const STALL_RULES = new Set(['job_stall', 'evaluation_stuck']);

  function alertChart(a) {
    // What the detector saw, on an axis around the alert, with the threshold line and the unit.
    const end = a.status === 'resolved' && a.ends_ms ? a.ends_ms : (a.ts || a.starts_ms);
    const color = a.status === 'resolved' ? COLORS.resolved : COLORS[a.severity] || COLORS.critical;
    let name = a.history_metric || 'metric';
    // The history's own unit (`history_unit`); a record from before units were carried: from its name.
    let unit = a.history_unit ?? metricUnit(name);
    let points = (a.history || []).filter((p) => p[1] !== null);
    // The step the job stopped at: the history's (the stall's own record), else the job's latest
    // (a resolved record's last_progress_ts is the step that ended the stall).
    const last = (points.length ? points[points.length - 1][0] : null) || a.last_progress_ts;
    if (STALL_RULES.has(a.rule) && unit === 's') {
      // The history is the silence itself, growing with every refresh of the firing alert.
      name = 'seconds without a step';
      if (a.status === 'resolved' && points.length && end > points[points.length - 1][0]) points.push([end, 0]);
    } else if (STALL_RULES.has(a.rule) && last) {
      // A record that keeps the last step as history; the threshold is seconds without one: plot those seconds.
      name = 'seconds without a step';
      unit = 's';
      points = [[last, 0], [a.starts_ms, (a.starts_ms - last) / 1000], [end, (end - last) / 1000]];
      if (a.status === 'resolved') points.push([end, 0]);
      points = points.filter((p, i) => i === 0 || p[0] >= points[i - 1][0]);
    }
    const times = [...points.map((p) => p[0]), a.starts_ms, end].filter((t) => t !== null && t !== undefined);
    const lo = Math.min(...times);
    const hi = Math.max(...times);
    const pad = Math.max(60000, 0.1 * (hi - lo));
    // The threshold is drawn only on an axis of its own unit (rank_hang's step numbers are no line on
    // its SM activity chart).
    const threshold = a.threshold !== null && a.threshold !== undefined && a.threshold_unit === unit ? a.threshold : null;
    const unitText = unit === 'ratio' || unit === 'count' || !unit ? (unit ? ` (${unit})` : '') : ` (${unit})`;
    // An alert without history (a rule that keeps none, a record written by hand) says so instead of an empty axis.
    const title = `What the detector saw: ${name}${unitText}${threshold === null ? '' : `; ${a.threshold_what || 'threshold'} ${valueText(threshold, unit)}`}${points.length ? '' : ' — the alert carries no history of it: only its span is drawn'}`;
    const extent = (v, side) => {
      // The y axis always shows the threshold, with a little room around the data.
      const values = [v[side], ...(threshold === null ? [] : [threshold])];
      const m = side === 'min' ? Math.min(...values) : Math.max(...values);
      const span = Math.max(Math.abs(v.max - v.min), Math.abs(m) * 0.05, 1e-9);
      return side === 'min' ? (m >= 0 && v.min >= 0 ? Math.max(0, m - 0.1 * span) : m - 0.1 * span) : m + 0.1 * span;
    };
    const units = { [name]: unit === 'ratio' || unit === 'count' ? '' : unit };
    const short = hi - lo + 2 * pad < 15 * 60000;
    return {
      title,
      meta: { name, unit, threshold, color, x: [lo - pad, hi + pad], points },
      option: {
        animation: false, grid: { left: 70, right: 110, top: 22, bottom: 24 }, tooltip: { trigger: 'axis', formatter: axisTip(units) },
        // Minutes over a long span; seconds over a short one, so no two ticks read the same ("12:28 12:28").
        xAxis: { type: 'time', min: lo - pad, max: hi + pad, minInterval: short ? 1000 : 60000,
          axisLabel: { formatter: (v) => (short ? fmtTime(v) : fmtTime(v).slice(0, 5)), hideOverlap: true } },
        yAxis: { type: 'value', name: unit && unit !== 'ratio' ? unit : '', nameTextStyle: { align: 'left' }, min: (v) => extent(v, 'min'), max: (v) => extent(v, 'max'), splitNumber: 3,
          // The padded extent is no round number (1.04111, 0.67379 over the ticks): only the ticks are labelled.
          axisLabel: { showMinLabel: false, showMaxLabel: false } },
        series: [{ name, type: 'line', data: points, showSymbol: true, color,
          markArea: { silent: true, itemStyle: { color: a.status === 'resolved' ? COLORS.resolvedBand : COLORS.alert }, data: [[{ xAxis: a.starts_ms }, { xAxis: end }]] },
          markLine: threshold === null ? undefined : { silent: true, symbol: 'none', lineStyle: { color: '#d62728', type: 'dashed' },
            label: { formatter: `${a.threshold_what || 'threshold'} ${valueText(threshold, unit)}`, position: 'end' }, data: [{ yAxis: threshold, name: 'threshold' }] } }],
      },
    };
  }

  // Silence (acknowledge) a firing alert in Alertmanager: the one write the UI makes, behind its own
  // authentication (a token pasted here, kept for this tab only, or the proxy's user header).
  function silenceForm(a) {
    const token = el('input', { type: 'password', name: 'token', placeholder: 'UI token (if the UI has one)', value: sessionStorage.getItem('ranksight-token') || '' });
    const author = el('input', { type: 'text', name: 'author', placeholder: 'your name', required: true });
    const comment = el('input', { type: 'text', name: 'comment', placeholder: 'why (ticket, what you are doing)', required: true, size: 40 });
    const minutes = el('select', { name: 'minutes' }, [[30, '30 min'], [60, '1 h'], [240, '4 h'], [1440, '1 day']].map(([m, label]) => el('option', { value: String(m), selected: m === 60 }, label)));
    const result = el('span', { id: 'silence-result', class: 'muted' }, '');
    const form = el('form', { class: 'toolbar silence', id: 'silence-form', onsubmit: async (e) => {
      e.preventDefault();
      if (token.value) sessionStorage.setItem('ranksight-token', token.value);
      result.textContent = 'silencing…';
      const headers = { 'content-type': 'application/json', accept: 'application/json', 'x-ranksight-action': 'silence' };
      if (token.value) headers.authorization = `Bearer ${token.value}`;
      const response = await fetch(`/api/alerts/${encodeURIComponent(a.alert_id)}/silence`, { method: 'POST', headers,
        body: JSON.stringify({ author: author.value, comment: comment.value, minutes: Number(minutes.value) }) }).catch((err) => ({ ok: false, json: async () => ({ error: err.message }) }));
      const body = await response.json().catch(() => ({}));
      result.textContent = response.ok ? `silenced in Alertmanager until ${fmtDateTime(Date.parse(body.ends_at))} (silence ${body.silence_id})` : `not silenced: ${body.error || response.status}`;
      result.className = response.ok ? 'ok' : 'error-text';
    } }, el('strong', {}, 'Silence in Alertmanager: '), author, comment, minutes, token, el('button', { type: 'submit' }, 'silence'), result);
    return form;
  }

  function renderAlert(root, payload) {
    RS.data = payload;
    const a = payload.alert;
    const evidence = payload.evidence;
    const fact = (k, v) => [factPair(k, v)];
    const chartSpec = alertChart(a);
    const since = a.status === 'firing' ? `firing since ${fmtDateTime(a.starts_ms)}` : `fired ${fmtDateTime(a.starts_ms)}, resolved ${fmtTime(a.ends_ms)} (${fmtDuration(a.ends_ms - a.starts_ms)})`;
    const head = el('div', { class: 'header' },
      el('h1', {}, REPORT ? '' : el('a', { href: '/', class: 'crumb' }, 'fleet › '), badge(a.severity), ` ${a.rule} `, el('span', { class: `status ${a.status}` }, a.status)),
      el('p', { class: 'summary-line' }, a.summary),
      a.resolution ? el('p', { class: 'resolution-line' }, el('span', { class: 'badge ok' }, 'resolved'), ` ${fmtDateTime(a.ends_ms)}: `, a.resolution) : null,
      el('p', { class: 'since' }, REPORT ? '' : el('a', { href: `/reports/alerts/${encodeURIComponent(a.alert_id)}`, style: 'float:right' }, 'download report'), since, ' · routed to ', el('strong', {}, a.team), ` (${a.receiver})`, ' · ', runbookLink(a)),
      el('dl', { class: 'facts' },
        ...fact('job', a.job_id ? el('a', { href: jobHref(a.job_id) }, a.job_id) : '-'), ...fact('run', a.run_id), ...fact('owner', a.owner),
        ...fact('where', where(a)), ...fact('GPU uuid', a.gpu_uuid), ...fact('cluster', a.cluster),
        ...fact('suspected layer', a.suspected_layer), ...fact('category', a.category),
        ...fact('invariant', a.invariant),
        ...fact(a.status === 'resolved' ? 'observed when it fired' : 'observed', el('span', { id: 'observed' }, valueFact(a.observed_fired ?? a.observed, a.observed_fired_unit ?? a.observed_unit, a.observed_fired_what ?? a.observed_what))),
        ...(a.status === 'resolved' ? fact('observed at resolution', el('span', { id: 'observed-resolved' }, valueFact(a.observed, a.observed_unit, a.observed_what))) : []),
        ...fact(a.threshold_what ? 'expected' : 'threshold', el('span', { id: 'threshold' }, valueFact(a.threshold, a.threshold_unit, a.threshold_what))),
        ...fact('baseline', a.baseline ? `${a.baseline} (${a.baseline_runs ?? '?'} runs)` : null),
        ...fact('current step', a.current_step), ...fact('last progress', fmtDateTime(a.last_progress_ts)),
        ...(a.job_id ? fact('progress', el('span', { id: 'alert-progress' }, alertProgress(a))) : []),
        ...fact('model / dataset', `${a.model_version} / ${a.dataset_version}`), ...fact('fingerprint', a.fingerprint),
        ...(a.image ? fact('image', a.image) : []), ...(a.workspace ? fact('workspace', a.workspace) : []),
        ...fact('group', a.group_key), ...fact('inhibited by', a.inhibited_by),
        ...fact('muted', a.muted_by ? el('a', { href: alertHref({ alert_id: a.muted_by.alert_id }), id: 'muted-by' }, mutedText(a)) : 'no'),
        ...fact('mutes', (a.mutes || []).length ? a.mutes.map((m, i) => [i ? ', ' : null, el('a', { href: alertHref(m), class: 'mutes' }, m.rule)]) : 'nothing'),
        ...fact('labels', Object.entries(a.labels || {}).map(([k, v]) => `${k}=${v}`).join(', '))),
      el('h2', {}, 'Routed copies'),
      el('table', { class: 'grid copies' },
        el('thead', {}, el('tr', {}, ['team', 'receiver', 'paged or informed', 'status', 'updated'].map((h) => el('th', {}, h)))),
        el('tbody', {}, (a.copies || []).map((c) => el('tr', { 'data-team': c.team, 'data-kind': c.kind || '' },
          el('td', {}, el('strong', {}, c.team)), el('td', {}, c.receiver), el('td', {}, c.kind || 'unknown (no ownership file given to the UI)'),
          el('td', {}, c.status), el('td', { class: 'nowrap' }, fmtDateTime(c.updated_ms)))))),
      actionsPanel(a.actions, 'alert-actions'),
      REPORT || a.status !== 'firing' ? null : silenceForm(a),
      el('h2', {}, 'Status history'),
      el('table', { class: 'grid' }, el('tbody', {}, a.transitions.map((t) => el('tr', {}, el('td', { class: 'nowrap' }, fmtDateTime(t.ts)), el('td', {}, t.status), el('td', { class: 'summary' }, t.summary, t.updated != null && t.updated !== t.ts ? el('span', { class: 'muted' }, ` (as of ${fmtDateTime(t.updated)})`) : null))))),
      el('section', { class: 'panel', id: 'panel-history' }, el('h3', {}, chartSpec.title), el('div', { id: 'history', class: 'chart', style: 'height:170px' })));
    root.replaceChildren(head);
    const hist = echarts.init(document.getElementById('history'));
    hist.setOption(chartSpec.option);
    RS.alertChart = chartSpec.meta;
    if (evidence) {
      root.append(el('h2', {}, `Evidence: job ${a.job_id} around the alert`), alertList(evidence), toolbar(evidence), el('div', { id: 'charts' }));
      renderJobCharts(document.getElementById('charts'), evidence);
      RS.charts.history = hist;
      focusAlert(evidence.alerts.find((x) => x.alert_id === a.alert_id) || a);
      if (evidence.details === 'pending' && !REPORT) loadDetails(evidence);
    } else {
      root.append(el('p', { class: 'muted' }, 'The alert names no job with stored data: no evidence panels.'));
    }
    RS.ready = true;
  }

  // --- compare page: runs overlaid by step or by tokens --------------------------------------------

  const RUN_COLORS = ['#4c78a8', '#e45756', '#54a24b', '#b279a2', '#f58518', '#72b7b2', '#9d755d', '#eeca3b'];
  const runLabel = (r) => `${r.job_id} · ${r.run_id}`;
  const SEGMENT_NAMES = { data_wait: 'data wait', forward: 'forward', backward: 'backward', optimizer: 'optimizer', comm: 'communication', checkpoint: 'checkpoint' };

  function xyTip(xName, unit) {
    // Tooltip of an x/y chart (steps or tokens on x): the x value, then each run's value with its unit.
    return (params) => {
      const list = (Array.isArray(params) ? params : [params]).filter((p) => p && Array.isArray(p.value));
      if (!list.length) return el('div', { class: 'tip' });
      return tip(`${xName} ${fmtCompact(list[0].value[0])}`, ...list.map((p) => tipLine(p.color, `${p.seriesName}: `, p.value[1] === null ? '-' : `${fmtNum(p.value[1], 4)}${unit ? ` ${unit}` : ''}`)));
    };
  }

  function compareOption(data, xKey, pick, yName, unit) {
    const xName = xKey === 'step' ? 'step' : 'tokens';
    return {
      animation: false,
      grid: { left: 70, right: 30, top: 30, bottom: 30 },
      tooltip: { trigger: 'axis', formatter: xyTip(xName, unit) },
      legend: { top: 0, type: 'scroll', textStyle: { fontSize: 11 } },
      xAxis: { type: 'value', name: xName, nameLocation: 'end', scale: true, axisLabel: { formatter: (v) => fmtCompact(v) } },
      yAxis: { type: 'value', name: yName, scale: true, splitNumber: 3 },
      dataZoom: [{ type: 'inside', xAxisIndex: 0, filterMode: 'none' }],
      series: data.runs.map((r, i) => ({
        name: runLabel(r), type: 'line', showSymbol: false, connectNulls: false, color: RUN_COLORS[i % RUN_COLORS.length], lineStyle: { width: 1.5 },
        data: data.series[i][xKey].map((x, k) => [x, pick(data.series[i])[k]]),
      })),
    };
  }

  function configTable(data, onlyDiffs) {
    const differs = new Set(data.config.differs);
    const keys = data.config.keys.filter((k) => !onlyDiffs || differs.has(k));
    return el('table', { class: 'grid config', id: 'config-diff' },
      el('thead', {}, el('tr', {}, el('th', {}, 'setting'), data.runs.map((r) => el('th', {}, runLabel(r))))),
      el('tbody', {}, keys.map((k) => el('tr', { class: differs.has(k) ? 'differs' : 'same', 'data-key': k },
        el('td', {}, k), data.runs.map((r) => el('td', {}, r.config[k] ?? ''))))));
  }

  function renderCompare(root, data, into) {
    // `into`: a job report's section; otherwise the whole page.
    RS.compare = data;
    const state = RS.compareState || (RS.compareState = { x: 'step', segment: 'data_wait', onlyDiffs: true });
    const box = el('div', { id: 'compare' });
    const charts = el('div', { id: 'compare-charts' });
    const draw = () => {
      for (const key of Object.keys(RS.charts)) if (key.startsWith('compare_')) { RS.charts[key].dispose(); delete RS.charts[key]; }
      charts.replaceChildren();
      const panel = (key, title, option) => chartBox(charts, key, title, 210).setOption(option);
      panel('compare_step_time', 'Step time, mean over ranks (s)', compareOption(data, state.x, (s) => s.step_time, 's', 's'));
      panel('compare_segment', `Step segment: ${SEGMENT_NAMES[state.segment]}, mean over ranks (s)`, compareOption(data, state.x, (s) => s.segments[state.segment], 's', 's'));
      panel('compare_loss', 'Loss (rank 0)', compareOption(data, state.x, (s) => s.loss, 'loss', ''));
      panel('compare_throughput', 'Throughput per GPU (tokens/s per GPU)', compareOption(data, state.x, (s) => s.tokens_per_gpu_s, 'tokens/s', 'tokens/s per GPU'));
      panel('compare_goodput', 'Goodput per run (productive / allocated GPU-hours, %)', {
        animation: false, grid: { left: 70, right: 30, top: 20, bottom: 60 },
        tooltip: { trigger: 'item', formatter: (p) => tip(p.name, tipLine(p.color, 'goodput: ', p.value === null ? 'unknown' : `${fmtFixed(p.value, 1)} %`)) },
        xAxis: { type: 'category', data: data.runs.map(runLabel), axisLabel: { interval: 0, rotate: 15, fontSize: 10, width: 160, overflow: 'truncate' } },
        yAxis: { type: 'value', name: '%', min: 0, max: 100 },
        series: [{ type: 'bar', data: data.runs.map((r, i) => ({ value: r.goodput_pct, itemStyle: { color: RUN_COLORS[i % RUN_COLORS.length] } })) }],
      });
    };
    const select = (name, options, current, onchange) => el('select', { name, onchange: (e) => { onchange(e.target.value); draw(); } },
      options.map(([v, label]) => el('option', v === current ? { value: v, selected: true } : { value: v }, label)));
    const diffBox = el('div', { id: 'config-box' }, configTable(data, state.onlyDiffs));
    box.append(
      into ? el('h2', {}, `Compare: ${data.family ? `runs of workload family ${data.family}` : 'runs'}`)
        : el('div', { class: 'header' }, el('h1', {}, REPORT ? '' : el('a', { href: '/', class: 'crumb' }, 'fleet › '), 'Compare runs'),
          el('p', {}, data.family ? `Runs of workload family ${data.family} (the newest ${data.runs.length}).` : `${data.runs.length} runs chosen.`)),
      el('table', { class: 'grid runs-compared' },
        el('thead', {}, el('tr', {}, ['', 'job', 'run', 'started', 'GPUs', 'outcome', 'goodput'].map((h) => el('th', {}, h)))),
        el('tbody', {}, data.runs.map((r, i) => el('tr', { 'data-run': r.run_id },
          el('td', {}, el('i', { class: 'swatch', style: `background:${RUN_COLORS[i % RUN_COLORS.length]}` })),
          el('td', {}, el('a', { href: jobHref(r.job_id) }, r.job_id)), el('td', {}, r.run_id), el('td', { class: 'nowrap' }, fmtDateTime(r.started_ms)),
          el('td', { class: 'num' }, r.gpus), el('td', {}, r.outcome || '-'), el('td', { class: 'num' }, r.goodput_pct === null ? '—' : `${fmtFixed(r.goodput_pct, 1)} %`))))),
      el('div', { class: 'toolbar' },
        'x axis ', select('x', [['step', 'by step'], ['tokens', 'by tokens']], state.x, (v) => { state.x = v; }),
        'segment ', select('segment', Object.entries(SEGMENT_NAMES), state.segment, (v) => { state.segment = v; }),
        el('span', { class: 'muted' }, `buckets of ${data.bucket_steps} step${data.bucket_steps === 1 ? '' : 's'}`)),
      charts,
      el('h2', {}, 'Configuration (JobStarted)'),
      el('label', {}, el('input', { type: 'checkbox', id: 'only-diffs', checked: state.onlyDiffs, onchange: (e) => { state.onlyDiffs = e.target.checked; diffBox.replaceChildren(configTable(data, state.onlyDiffs)); } }),
        ` only settings that differ (${data.config.differs.length} of ${data.config.keys.length})`),
      diffBox);
    if (into) into.append(box); else root.replaceChildren(box);
    draw();
    RS.ready = true;
  }

  // --- live updates and start ---------------------------------------------------------------------

  async function poll(root, page, initial) {
    let version = initial;
    setInterval(async () => {
      try {
        const v = JSON.stringify(await getJSON('/api/version'));
        if (v !== version) {
          if (page.kind === 'fleet') { renderFleet(root, await getJSON('/api/fleet')); loadGoodput(root); loadSilences(root); }
          else if (page.kind === 'job' && !RS.window) renderJob(root, await getJSON(`/api/jobs/${encodeURIComponent(page.id)}${location.search}`));
          else if (page.kind === 'alert') renderAlert(root, await getJSON(`/api/alerts/${encodeURIComponent(page.id)}`));
        }
        version = v;
        document.body.classList.remove('offline');
      } catch (err) {
        document.body.classList.add('offline');
      }
    }, page.pollMs || 5000);
  }

  async function start() {
    const root = document.getElementById('app');
    const page = REPORT ? REPORT.page : JSON.parse(document.body.dataset.page);
    RS.page = page;
    // The version is taken before the data: anything stored after it makes the first poll refetch.
    let version = null;
    if (!REPORT) version = JSON.stringify(await getJSON('/api/version').catch(() => null));
    try {
      if (page.kind === 'fleet') {
        renderFleet(root, REPORT ? REPORT.data : await getJSON('/api/fleet'));
        if (!REPORT) { loadGoodput(root); loadSilences(root); }
      } else if (page.kind === 'job') {
        renderJob(root, REPORT ? REPORT.data : await getJSON(`/api/jobs/${encodeURIComponent(page.id)}${location.search}`));
      } else if (page.kind === 'alert') {
        renderAlert(root, REPORT ? REPORT.data : await getJSON(`/api/alerts/${encodeURIComponent(page.id)}`));
      } else if (page.kind === 'history') {
        renderHistory(root, await getJSON(`/api/history${location.search}`));
      } else if (page.kind === 'compare') {
        renderCompare(root, REPORT ? REPORT.data : await getJSON(`/api/compare${location.search}`));
      }
    } catch (err) {
      showError(root, err.message);
      RS.error = err.message;
      return;
    }
    if (!REPORT) poll(root, page, version);
  }

  RS.focusAlert = focusAlert;
  RS.setWindow = setWindow;
  document.addEventListener('DOMContentLoaded', start);
})();
