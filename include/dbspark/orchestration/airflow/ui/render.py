"""The dbspark page as HTML, rendered on the server: tables, and each loop's
convergence as an inline SVG. No script or style comes from elsewhere (nothing is
downloaded when the page is shown); every value from the catalog is escaped."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from html import escape

from dbspark.orchestration.airflow.ui.status import (
    CircuitStatus,
    CircuitSummary,
    CollectionStatus,
    EpochStatus,
    Link,
    LoopRun,
    LoopStatus,
)
from dbspark.orchestration.intervals import Interval

#: Epochs drawn per loop in the convergence plot (the newest shown).
PLOTTED_EPOCHS = 10
_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)

_STYLE = """
body { font-family: system-ui, sans-serif; font-size: 14px; margin: 16px; color: #1a202c; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; } h3 { font-size: 14px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border-bottom: 1px solid #e2e8f0; padding: 4px 8px; text-align: left;
  vertical-align: top; }
th { background: #f7fafc; font-weight: 600; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.muted { color: #718096; } .open { color: #b7791f; } .committed { color: #2f855a; }
a { color: #2b6cb0; text-decoration: none; } a:hover { text-decoration: underline; }
ul.links { list-style: none; margin: 0; padding: 0; }
svg text { font-size: 11px; fill: #4a5568; }
.legend span { display: inline-block; margin-right: 12px; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
@media (prefers-color-scheme: dark) {
  body { background: #1a202c; color: #e2e8f0; } th { background: #2d3748; }
  th, td { border-color: #4a5568; } a { color: #90cdf4; } svg text { fill: #cbd5e0; }
}
"""

# Inside the Airflow UI the page sits in an iframe whose sandbox forbids navigating the
# top window; a link created in the (same-origin) top document and clicked there is the
# top document's own navigation, so links to runs and logs open as the UI's own pages
# instead of a UI nested in the frame. Opened on its own, the page's links are plain.
_SCRIPT = """
document.addEventListener("click", (event) => {
  const link = event.target.closest("a[data-airflow-ui]");
  if (!link || window.top === window || event.button !== 0 || event.metaKey ||
      event.ctrlKey || event.shiftKey) {
    return;
  }
  try {
    const top = window.top.document;
    const outer = top.createElement("a");
    outer.href = link.href;
    top.body.appendChild(outer);
    outer.click();
    outer.remove();
    event.preventDefault();
  } catch (error) {
    // Another origin: follow the link inside the frame.
  }
});
"""


def page(title: str, body: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}<script>{_SCRIPT}</script></body></html>"
    )


def index_page(
    summaries: Sequence[CircuitSummary],
    catalog: str,
    circuit_url: Callable[[str], str],
    missing: bool = False,
) -> str:
    """Every circuit of the catalog, one line each."""
    parts = ["<h1>dbspark</h1>", f'<p class="muted">catalog: {escape(catalog)}</p>']
    if missing:
        parts.append("<p>No catalog yet: no epoch has run in this deployment.</p>")
    elif not summaries:
        parts.append("<p>The catalog holds no circuit yet.</p>")
    else:
        rows = [
            [
                _a(s.name, circuit_url(s.name)),
                _links(s.dags),
                _num(s.epochs),
                _num(s.last_committed_epoch) if s.last_committed_epoch >= 0 else "none",
                ", ".join(str(e) for e in s.open_epochs) or "none",
                escape(_label(s.last_label)),
                _num_bytes(s.live_bytes),
                _num_bytes(s.superseded_bytes),
            ]
            for s in summaries
        ]
        head = [
            "circuit",
            "DAG",
            "epochs",
            "last committed",
            "open",
            "latest interval",
            "live traces",
            "superseded",
        ]
        parts.append(_table(head, rows, numeric={2, 3, 6, 7}))
    return page("dbspark", "".join(parts))


def circuit_page(status: CircuitStatus, catalog: str, index_url: str, json_url: str) -> str:
    s = status.summary
    parts = [
        f'<p><a href="{escape(index_url)}">dbspark</a> / {escape(s.name)}</p>',
        f"<h1>circuit {escape(s.name)}</h1>",
        f"<p>DAG: {_inline(s.dags) or 'none recorded'} &middot; {_count(s.epochs, 'epoch')}, "
        f"last committed {s.last_committed_epoch if s.last_committed_epoch >= 0 else 'none'}"
        f' &middot; <span class="muted">catalog {escape(catalog)} &middot; '
        f'<a href="{escape(json_url)}">JSON</a></span></p>',
        _epochs_section(status),
        _loops_section(status.loops, [e.epoch for e in status.epochs]),
        _collections_section(status.collections),
    ]
    return page(f"dbspark: {s.name}", "".join(parts))


# --- sections ----------------------------------------------------------------------------


def _epochs_section(status: CircuitStatus) -> str:
    total = status.summary.epochs
    shown = len(status.epochs)
    note = f" (the newest {shown} of {total})" if shown < total else ""
    head = ["epoch", "interval", "state", "opened", "duration"]
    head += [f"rows in: {source}" for source in status.sources]
    head += [f"rows changed: {view}" for view in status.views]
    head += ["DAG runs", "task logs"]
    numeric = {0, 4, *range(5, 5 + len(status.sources) + len(status.views))}
    rows = [_epoch_row(e, status.sources, status.views) for e in status.epochs]
    return f"<h2>Epochs{escape(note)}</h2>" + (
        _table(head, rows, numeric=numeric) if rows else "<p>No epoch has opened yet.</p>"
    )


def _epoch_row(e: EpochStatus, sources: Sequence[str], views: Sequence[str]) -> list[str]:
    return [
        _num(e.epoch),
        escape(_label(e.label)),
        f'<span class="{escape(e.state)}">{escape(e.state)}</span>',
        escape(_moment(e.opened_at)),
        escape(_duration(e.duration_seconds)),
        *(_num(e.rows_in[s]) if s in e.rows_in else "" for s in sources),
        *(_num(e.rows_changed[v]) if v in e.rows_changed else "" for v in views),
        _links(e.runs, airflow=True) or '<span class="muted">none recorded</span>',
        _links(e.task_logs, airflow=True),
    ]


def _loops_section(loops: Sequence[LoopStatus], epochs: Sequence[int]) -> str:
    if not loops:
        return ""
    parts = ["<h2>Loops: delta rows per iteration</h2>"]
    for loop in loops:
        parts.append(f"<h3>loop {escape(loop.name)}</h3>")
        newest = sorted(loop.runs, key=lambda r: r.prefix, reverse=True)
        parts.append(convergence_plot(loop, newest[:PLOTTED_EPOCHS]))
        rows = [
            [
                escape(", ".join(str(t) for t in run.prefix)),
                _num(len(run.iterations)),
                escape(" → ".join(str(i.delta_rows) for i in run.iterations)),
                "converged" if run.converged else '<span class="open">not converged</span>',
                escape(run.iterations[-1].reason if run.iterations else ""),
            ]
            for run in newest
        ]
        head = ["epoch", "iterations", "delta rows", "state", "why it stopped"]
        parts.append(_table(head, rows, numeric={1}))
    return "".join(parts)


def convergence_plot(loop: LoopStatus, runs: Sequence[LoopRun]) -> str:
    """Delta rows against iteration, one line per epoch, on a log scale (deltas shrink
    by orders of magnitude before reaching zero)."""
    width, height, left, right, top, bottom = 580, 220, 80, 16, 12, 36
    iterations = max((len(r.iterations) for r in runs), default=0)
    biggest = max((i.delta_rows for r in runs for i in r.iterations), default=0)
    decades = max(1, math.ceil(math.log10(biggest + 1)))
    span_x = max(iterations - 1, 1)

    def x(iteration: int) -> float:
        return left + (width - left - right) * iteration / span_x

    def y(rows: int) -> float:
        return top + (height - top - bottom) * (1 - math.log10(rows + 1) / decades)

    parts = [
        f'<svg role="img" aria-label="convergence of loop {escape(loop.name)}" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
        f'<line x1="{left}" y1="{y(0)}" x2="{width - right}" y2="{y(0)}" stroke="#a0aec0"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{y(0)}" stroke="#a0aec0"/>',
    ]
    for decade in range(decades + 1):
        rows = 10**decade if decade else 0
        parts.append(
            f'<text x="{left - 6}" y="{y(rows) + 4:.1f}" text-anchor="end">{rows:,}</text>'
        )
    for iteration in range(iterations):
        parts.append(
            f'<text x="{x(iteration):.1f}" y="{height - bottom + 16}" '
            f'text-anchor="middle">{iteration}</text>'
        )
    parts.append(
        f'<text x="{(left + width - right) / 2}" y="{height - 4}" text-anchor="middle">'
        "iteration</text>"
        f'<text x="12" y="{(top + height - bottom) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 12 {(top + height - bottom) / 2})">delta rows</text>'
    )
    legend = []
    for n, run in enumerate(runs):
        color = _PALETTE[n % len(_PALETTE)]
        points = " ".join(f"{x(i.iteration):.1f},{y(i.delta_rows):.1f}" for i in run.iterations)
        label = ", ".join(str(t) for t in run.prefix)
        deltas = ", ".join(str(i.delta_rows) for i in run.iterations)
        parts.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}">'
            f"<title>epoch {escape(label)}: {escape(deltas)}</title></polyline>"
        )
        for i in run.iterations:
            parts.append(
                f'<circle cx="{x(i.iteration):.1f}" cy="{y(i.delta_rows):.1f}" r="3" '
                f'fill="{color}"><title>epoch {escape(label)}, iteration {i.iteration}: '
                f"{i.delta_rows} rows</title></circle>"
            )
        legend.append(
            f'<span><span class="swatch" style="background:{color}"></span>'
            f"epoch {escape(label)}</span>"
        )
    parts.append("</svg>")
    return "".join(parts) + f'<div class="legend">{"".join(legend)}</div>'


def _collections_section(collections: Sequence[CollectionStatus]) -> str:
    head = [
        "collection",
        "holds",
        "live batches",
        "live rows",
        "live bytes",
        "superseded batches",
        "superseded rows",
        "superseded bytes",
        "compacted up to (frontier)",
    ]
    rows = [
        [
            escape(c.collection),
            escape(c.role),
            _num(c.live_batches),
            _num(c.live_rows),
            _num_bytes(c.live_bytes),
            _num(c.superseded_batches),
            _num(c.superseded_rows),
            _num_bytes(c.superseded_bytes),
            escape(_frontier(c.frontier)),
        ]
        for c in collections
    ]
    return (
        "<h2>Traces and compaction</h2>"
        '<p class="muted">Superseded batches were replaced by compaction (or retired) and '
        "stay on disk until garbage collection.</p>" + _table(head, rows, numeric=set(range(2, 8)))
    )


# --- small pieces ------------------------------------------------------------------------


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], numeric: set[int]) -> str:
    """A table whose head is text (escaped here) and whose cells are HTML already."""
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{cell}</td>' if n in numeric else f"<td>{cell}</td>"
            for n, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _a(text: str, url: str, *, airflow: bool = False) -> str:
    marker = " data-airflow-ui" if airflow else ""
    return f'<a href="{escape(url)}"{marker}>{escape(text)}</a>'


def _links(links: Sequence[Link], *, airflow: bool = True) -> str:
    if not links:
        return ""
    items = "".join(f"<li>{_a(link.label, link.url, airflow=airflow)}</li>" for link in links)
    return f'<ul class="links">{items}</ul>'


def _inline(links: Sequence[Link]) -> str:
    return ", ".join(_a(link.label, link.url, airflow=True) for link in links)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _num(value: int) -> str:
    return f"{value:,}"


def _num_bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _label(label: str | None) -> str:
    """A data interval as ``2026-01-01 00:00 → 2026-01-02 00:00`` (UTC); any other label
    (an epoch run by hand) as it is."""
    if not label:
        return ""
    try:
        interval = Interval.parse(label)
    except ValueError:
        return label
    return f"{interval.start:%Y-%m-%d %H:%M} → {interval.end:%Y-%m-%d %H:%M}"


def _moment(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else ""


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "not committed"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def _frontier(frontier: Sequence[Sequence[int]] | None) -> str:
    if frontier is None:
        return "none recorded"
    return " ".join("(" + ", ".join(str(t) for t in time) + ")" for time in frontier)
