"use strict";
// Disbatch web UI: number and time formats, and the charts, drawn as SVG by hand (no
// library): line charts with a data table beside them for keyboard and screen-reader
// users, sparklines and usage bars.

const NUM = new Intl.NumberFormat();
const fmtNum = (n) => n == null ? "-" : NUM.format(n);
const fmtPct = (x) => x == null || !isFinite(x) ? "-" : (x * 100).toFixed(x < 0.1 ? 1 : 0) + "%";

// A duration in seconds, readable: 850 µs, 12 ms, 1.4 s, 3 min 5 s.
function fmtSecs(s) {
  if (s == null) return "-";
  if (s < 0.001) return Math.round(s * 1e6) + " µs";
  if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 1 : 0) + " ms";
  if (s < 60) return s.toFixed(s < 10 ? 2 : 1) + " s";
  return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
}

const REL = new Intl.RelativeTimeFormat(undefined, { numeric: "auto" });
// "3 minutes ago" for a time, from its ISO string, {"$date"} or epoch milliseconds.
function relTime(v) {
  const ms = typeof v === "number" ? v : new Date(v && v.$date ? v.$date : v).getTime();
  if (!isFinite(ms)) return "-";
  const secs = (ms - Date.now()) / 1000;
  const abs = Math.abs(secs);
  if (abs < 60) return REL.format(Math.round(secs), "second");
  if (abs < 3600) return REL.format(Math.round(secs / 60), "minute");
  if (abs < 86400) return REL.format(Math.round(secs / 3600), "hour");
  return REL.format(Math.round(secs / 86400), "day");
}

// A time shown both ways: relative, and absolute beside it (and in the datetime attribute).
function when(v) {
  if (v == null) return "-";
  const d = new Date(typeof v === "object" && v.$date ? v.$date : v);
  if (!isFinite(d.getTime())) return "-";
  return `<time datetime="${d.toISOString()}" title="${esc(d.toISOString())}">${esc(relTime(d.getTime()))} <small>(${esc(d.toLocaleString())})</small></time>`;
}

const hhmm = (ms) => new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });

// A round upper end for an axis.
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

// The largest of `values` and `floor`, without spreading them as arguments (which
// overflows the call stack past about 100,000 values).
const maxOf = (values, floor) => values.reduce((a, v) => (v != null && v > a ? v : a), floor);

// A line chart. `times`: the points' start times (ms); `series`: [{name, label, colour,
// values: [number | null]}]. Every point is a circle carrying its value (`data-v`); each
// series' values are in its group's `data-values`. A table of the same numbers follows in
// a <details>, so nothing is only visible.
function lineChart(id, { title, times, series, format = fmtNum, height = 170 }) {
  const W = 640, H = height, L = 56, R = 10, T = 10, B = 24;
  const values = series.flatMap((s) => s.values.filter((v) => v != null));
  const max = niceMax(maxOf(values, 0));
  const n = times.length;
  const x = (i) => L + (n <= 1 ? (W - L - R) / 2 : (i * (W - L - R)) / (n - 1));
  const y = (v) => T + (H - T - B) * (1 - v / max);
  let grid = "";
  for (const f of [0, 0.5, 1]) {
    const yy = y(max * f);
    grid += `<line class="grid" x1="${L}" x2="${W - R}" y1="${yy}" y2="${yy}"></line><text class="axis" x="${L - 6}" y="${yy + 4}" text-anchor="end">${esc(format(max * f))}</text>`;
  }
  for (const i of n > 1 ? [0, Math.floor((n - 1) / 2), n - 1] : [0]) {
    grid += `<text class="axis" x="${x(i)}" y="${H - 6}" text-anchor="middle">${esc(hhmm(times[i]))}</text>`;
  }
  const lines = series.map((s) => {
    let d = "";
    let pen = "M";
    const dots = s.values.map((v, i) => {
      if (v == null) { pen = "M"; return ""; }
      d += `${pen}${x(i).toFixed(1)},${y(v).toFixed(1)} `;
      pen = "L";
      return `<circle class="pt" cx="${x(i).toFixed(1)}" cy="${y(v).toFixed(1)}" r="2.2" data-i="${i}" data-v="${v}"><title>${esc(hhmm(times[i]))} ${esc(s.label)}: ${esc(format(v))}</title></circle>`;
    }).join("");
    return `<g class="series" data-series="${esc(s.name)}" data-values="${s.values.map((v) => v ?? "").join(",")}" style="--c:${s.colour}"><path d="${d}"></path>${dots}</g>`;
  }).join("");
  const legend = series.map((s) => `<li><span class="swatch" style="background:${s.colour}"></span>${esc(s.label)}</li>`).join("");
  const head = series.map((s) => `<th>${esc(s.label)}</th>`).join("");
  const rows = times.map((t, i) => `<tr><td>${esc(new Date(t).toLocaleString())}</td>${series.map((s) => `<td class="num">${esc(s.values[i] == null ? "-" : format(s.values[i]))}</td>`).join("")}</tr>`).join("");
  const summary = series.map((s) => s.label + " up to " + format(maxOf(s.values, 0))).join("; ");
  return `<figure class="chart" id="${esc(id)}">
    <figcaption>${esc(title)}</figcaption>
    <svg viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" role="img" aria-label="${esc(title + ": " + summary)}">${grid}${lines}</svg>
    <ul class="legend">${legend}</ul>
    <details><summary>Data</summary><table class="chart-data"><thead><tr><th>From</th>${head}</tr></thead><tbody>${rows}</tbody></table></details>
  </figure>`;
}

// A small line of values, for tables.
function sparkline(values, label) {
  const W = 120, H = 24;
  const max = maxOf(values, 1);
  const n = values.length;
  const pts = values.map((v, i) => `${(n <= 1 ? W / 2 : (i * W) / (n - 1)).toFixed(1)},${(H - 2 - ((H - 4) * v) / max).toFixed(1)}`).join(" ");
  return `<svg class="spark" viewBox="0 0 ${W} ${H}" width="${W}" height="${H}" role="img" aria-label="${esc(label)}" data-values="${values.join(",")}"><polyline points="${pts}"></polyline></svg>`;
}

// Used against a limit: a bar and "3 / 4" (no limit: the bar stays empty).
function usageBar(used, limit) {
  const pct = limit ? Math.min(100, (100 * used) / limit) : 0;
  return `<span class="usage" role="meter" aria-valuemin="0" aria-valuenow="${used}"${limit ? ` aria-valuemax="${limit}"` : ""} aria-label="running tasks"><span class="bar"><span style="width:${pct}%"></span></span> ${fmtNum(used)} / ${limit == null ? "no limit" : fmtNum(limit)}</span>`;
}

// The series of GET /stats as chart data.
const pointTimes = (s) => s.points.map((p) => new Date(p.t).getTime());
const field = (s, k) => s.points.map((p) => p[k]);
const failureRate = (s) => s.points.map((p) => (p.succeeded + p.failed > 0 ? p.failed / (p.succeeded + p.failed) : null));
