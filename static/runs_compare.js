/* The compare page: one overlaid chart per metric (a trace per run), x by step, tokens or wall
   time, EMA smoothing, log scale; and the "differences only" switch of the config table. While a
   compared run is queued or running, the page reads itself again every 5 s, otherwise every 30 s (a
   run may be resumed), only while it is shown, and redraws its charts, final metrics and generations. A run
   with data.eval_group_by logs eval/<metric>/<group>: as on the run page (static/metric_groups.js)
   the groups of a metric are the lines of one chart, "<metric> by <column>", here one line per run
   and group: a group's color, a run's dash, named "<group> · <run>". A click on a run's name in a legend
   hides that run in every chart (a double click shows it alone), as a redraw or a reading again keeps it; a click on
   a group in a chart by group's legend hides that group's lines in every chart by group, the same way.
   The charts can be filtered by metric name (a GRPO run logs 30 and more).
   The generations side by side show each run at the step picked in its column (gen=); the final metrics sort by a
   column (finals=).
   The view's settings are kept in the address, so that a link to the page opens the same view. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("compare-data").textContent);
  var LIVE_MS = 5000, IDLE_MS = window.TemperCompareIdleMs || 30000;  // a test shortens the idle wait
  var holder = document.getElementById("compare-charts");
  // One color a run, for as many runs as the page takes (views.MAX_COMPARE).
  var colors = ["#4f46e5", "#db2777", "#059669", "#d97706", "#0891b2", "#7c3aed", "#dc2626", "#65a30d", "#475569", "#c026d3",
                "#0d9488", "#ea580c", "#2563eb", "#9333ea", "#ca8a04", "#be123c"];
  var dashes = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"];
  // A run's name, a metric's, a group's as plotly shows them: as text, never as its tags (static/plot_text.js).
  var literal = window.TemperPlotText.literal;
  var xAxis = document.getElementById("x-axis"), ema = document.getElementById("ema"), logY = document.getElementById("log-y");
  // The ids of the runs hidden from every chart, and the group labels hidden from every chart by group (a group is one
  // column value, "sum" in eval/exact_match by task as in eval/loss by task), by a legend's click (static/plot_legend.js,
  // as the run page hides its groups).
  var legends = window.TemperPlotLegend;
  var hidden = legends.hiddenKeys({ button: document.getElementById("show-all-runs"), noun: "run", parameter: "hide",
                                    holder: holder, redraw: draw });
  var hiddenGroups = legends.hiddenKeys({ button: document.getElementById("show-all-groups"), noun: "group",
                                          parameter: "hidegroups", holder: holder, redraw: draw });
  var chartFilter = document.getElementById("chart-filter"), noMatch = document.getElementById("no-chart-matches");

  // Each chart in the order of the metric names: its key (its title), whether it holds groups, whether
  // it is shared (one quantity that kinds of run log under names of their own, selectors.shared_charts:
  // its lines named "<run> · <metric>", its title naming its metrics), and its lines:
  // { run, runIndex, metric, label } (label: the group's, or null).
  function chartsOf() {
    var charts = [], byKey = {};
    function chart(key, grouped, shared) {
      if (!byKey[key]) charts.push(byKey[key] = { key: key, grouped: grouped, shared: shared, lines: [], labels: [] });
      return byKey[key];
    }
    data.names.forEach(function (name) {
      data.runs.forEach(function (run, runIndex) {
        if (!data.series[run.id][name]) return;
        var shared = (data.shared[run.id] || {})[name];
        var group = shared ? null : window.TemperMetricGroups.groupOf(name, run.group_by);
        var target = chart(shared || (group ? group.chart : name), Boolean(group), Boolean(shared));
        if (group && target.labels.indexOf(group.label) < 0) target.labels.push(group.label);
        target.lines.push({ run: run, runIndex: runIndex, metric: name, label: group ? group.label : null });
      });
    });
    // A shared chart's lines in the runs' order, as on every other chart (its metrics came in name order).
    charts.forEach(function (chart) {
      if (!chart.shared) return;
      chart.lines.sort(function (a, b) { return a.runIndex - b.runIndex; });
      chart.metrics = chart.lines.map(function (line) { return line.metric; })
        .filter(function (metric, index, all) { return all.indexOf(metric) === index; });
    });
    return charts;
  }

  var smooth = window.TemperSmoothing.ema;  // static/plot_smoothing.js, as the run page smooths

  function trace(chart, line, axis, weight) {
    // Its x by step, tokens or time: each run's are sent once for all its series that share them
    // (selectors.series_with_shared_x).
    var entry = data.series[line.run.id][line.metric], xs = data.x[line.run.id][entry.x];
    var values = smooth(entry.value, weight);
    var common = { x: xs[axis], y: values, customdata: axes.formatValues(values), type: "scatter", mode: "lines",
                   hovertemplate: axes.HOVER_TEMPLATE,
                   visible: hidden.has(line.run.id) || hiddenGroups.has(line.label) ? "legendonly" : true };
    if (!chart.grouped) {
      return Object.assign(common, { name: literal(chart.shared ? line.run.name + " · " + line.metric : line.run.name),
        legendgroup: legends.group(line.run.id + " " + line.metric), line: { color: colors[line.runIndex % colors.length], width: 1.5 } });
    }
    var color = colors[chart.labels.indexOf(line.label) % colors.length];
    return Object.assign(common, { name: literal(line.label + " · " + line.run.name),
      legendgroup: legends.group(line.run.id + " " + line.metric), line: { color: color, width: 1.5, dash: dashes[line.runIndex % dashes.length] } });
  }

  // The runs' colors are the same on every plain chart, so their legend is drawn once: on the first
  // chart, and on a later one only where it holds a run no chart above it named (one without the first
  // chart's metric: an external run logging its own names, a DPO run beside a reward run).
  function legendCharts(charts) {
    var named = {};
    return charts.filter(function (chart) {
      if (chart.grouped) return false;
      var unnamed = chart.lines.filter(function (line) { return !named[line.run.id]; });
      unnamed.forEach(function (line) { named[line.run.id] = true; });
      return unnamed.length > 0;
    });
  }

  var charts = chartsOf();
  var withLegend = legendCharts(charts);

  // A run of more steps than the page draws (selectors.COMPARE_MAX_POINTS) is drawn as the lowest and highest value
  // of each bucket of steps, spikes kept; its chart says so, and where every point is.
  var DOWNSAMPLED_NOTE = "downsampled: every point is in the CSV download";

  // The legend lies under the x axis, in as many rows as the names need at the chart's width, which
  // plotly only knows once it has drawn it. Placed at a share of the plot's height (y: -0.25) it fell
  // across the axis's numbers and title, which sit a number of pixels under the plot. So it is pinned
  // to the figure's bottom edge, and once drawn its height is measured and added to the bottom
  // margin and to the figure, under the room the axis needs.
  var AXIS_ROOM = 44; // pixels under the plot for the x axis's numbers and title
  var NOTE_ROOM = 16;  // pixels of a line of the title
  var axes = window.TemperPlotAxis;  // static/plot_axis.js: the x axis, the log scale, the title's notes, as the run page's

  function layout(plot, chart, allTraces, axis, legendHeight) {
    // The axes and notes are of the runs shown: a hidden run's values neither stretch nor pin them.
    var traces = allTraces.filter(function (each) { return each.visible !== "legendonly"; });
    var log = axes.logApplies(traces, logY.checked);
    var notes = chart.shared ? [chart.metrics.join(" · ")] : [];
    if (chart.lines.some(function (line, index) {
      return allTraces[index].visible !== "legendonly" && data.series[line.run.id][line.metric].downsampled;
    })) notes.push(DOWNSAMPLED_NOTE);
    var title = axes.title(chart.key, traces, logY.checked, notes);
    var titleRoom = (title.lines - 1) * NOTE_ROOM, revision = axes.viewRevision(axis, logY.checked);
    return {
      height: (chart.grouped ? 300 : 260) + legendHeight + titleRoom,
      margin: Object.assign({ t: 28 + titleRoom, b: AXIS_ROOM + legendHeight }, axes.SIDE_MARGINS),
      title: { text: title.text, font: { size: 13 } },
      uirevision: revision,  // the reader's zoom lasts across the page's redraws
      // Curves are read across runs at one step (or tokens, or time): the hover lists every line there.
      hovermode: "x unified",
      xaxis: axes.xAxis(axis, traces, plot),
      yaxis: axes.yAxis(chart.key, traces, log, axes.zoomedY(plot, revision)),
      legend: legends.layout({ orientation: "h", yref: "container", y: 0, yanchor: "bottom" }),
      // The whole name: plotly cuts it at 15 characters, and a sweep's runs differ only at their ends. The unified
      // hover's box took the chart's transparent background where the chart has no legend, its text over the lines.
      hoverlabel: { namelength: -1, bgcolor: "#ffffff" },
      showlegend: chart.grouped || withLegend.indexOf(chart) >= 0,
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { size: 11 },
    };
  }

  function measuredLegendHeight(plot) {
    var legend = plot.querySelector(".legend");
    return legend ? Math.ceil(legend.getBoundingClientRect().height) : 0;
  }

  // After every drawing (a new x axis, a resize that rewraps the names): make room for the legend
  // as drawn. Once the room fits, the next drawing measures the same height and stops there. The chart is
  // drawn again with its whole layout, no width in it (plotly keeps the width drawn): a relayout of its height would pin
  // plotly's width as well. Its width follows its place's by static/plot_axis.js (fitTicks).
  function fitLegend(plot) {
    var height = measuredLegendHeight(plot), reserved = Number(plot.dataset.legendHeight || 0);
    if (height === reserved) return;
    plot.dataset.legendHeight = height;
    var chart = charts.filter(function (each) { return each.key === plot.dataset.metric; })[0];
    window.Plotly.react(plot, plot.data, axes.withShownRange(plot, layout(plot, chart, plot.data, xAxis.value, height)),
                        axes.PLOT_CONFIG);
  }

  function draw() {
    var axis = xAxis.value, weight = Number(ema.value);
    // The legends are of the charts shown: with the loss chart filtered out, the first one shown names the runs.
    withLegend = legendCharts(charts.filter(matchesFilter));
    document.getElementById("ema-value").textContent = weight.toFixed(2);
    // The server sends the charts in their order (selectors.chart_order): a chart new to the page (a metric
    // a running run logged first since) goes after the one before it there, not last.
    var previous = null;
    charts.forEach(function (chart) {
      var plot = holder.querySelector('[data-metric="' + CSS.escape(chart.key) + '"]');
      var created = !plot;
      if (created) {
        var figure = document.createElement("figure");
        figure.className = "chart";
        plot = document.createElement("div");
        plot.className = "plot";
        plot.dataset.metric = chart.key;
        figure.append(plot, window.TemperPlotDownload.button(plot, chart.key, holder.dataset.downloadName));
        holder.insertBefore(figure, previous ? previous.nextSibling : holder.firstChild);
      }
      previous = plot.parentNode;
      // What a screen reader hears of the chart: the Final metrics table has the numbers of each run.
      previous.setAttribute("aria-label", chart.key + " by " + xAxis.options[xAxis.selectedIndex].text +
        (document.querySelector(".final-table") ? ": each run's last, lowest and highest value are in the Final metrics table" : ""));
      // A chart filtered out is hidden, not removed; one shown again is sized to its place (drawn while hidden,
      // plotly gave it its default width).
      var wasHidden = previous.hidden;
      previous.hidden = !matchesFilter(chart);
      var traces = chart.lines.map(function (line) { return trace(chart, line, axis, weight); });
      window.Plotly.react(plot, traces, axes.withShownRange(plot, layout(plot, chart, traces, axis,
                                                                         Number(plot.dataset.legendHeight || 0))),
                          axes.PLOT_CONFIG);
      if (wasHidden && !previous.hidden) axes.fitToPlace(plot);
      if (created) {
        axes.keepZoom(plot);
        axes.fitTicks(plot);
        plot.on("plotly_afterplot", function () { fitLegend(plot); });
        legends.follow(plot, function (curveNumber, alone) { hideFromLegend(plot, curveNumber, alone); });
      }
      fitLegend(plot);
    });
  }

  // A legend's click on a plain chart acts on its run, in every chart; on a chart by group, on its entry's group (its
  // entries are a group and a run), in every chart by group.
  function hideFromLegend(plot, curveNumber, alone) {
    var chart = charts.filter(function (each) { return each.key === plot.dataset.metric; })[0];
    if (!chart) return;
    var line = chart.lines[curveNumber];
    var keys = chart.grouped ? hiddenGroups : hidden, key = chart.grouped ? line.label : line.run.id;
    if (alone) keys.showAlone(key, chart.grouped ? groupLabels() : data.runs.map(function (run) { return run.id; }));
    else keys.toggle(key);
  }
  // The labels of the groups drawn, in every chart by group.
  function groupLabels() {
    return charts.reduce(function (labels, chart) {
      return labels.concat(chart.labels.filter(function (label) { return labels.indexOf(label) < 0; }));
    }, []);
  }

  // A chart is shown when its name, or a metric it draws, holds the filter's text (case aside): "eval/" keeps
  // the evaluation charts, "reward" every reward's.
  function matchesFilter(chart) {
    var text = chartFilter.value.trim().toLowerCase();
    if (!text) return true;
    return [chart.key].concat(chart.lines.map(function (line) { return line.metric; }))
      .some(function (name) { return name.toLowerCase().indexOf(text) >= 0; });
  }
  function showNoMatch() {
    var text = chartFilter.value.trim();
    noMatch.hidden = !text || !charts.length || charts.some(matchesFilter);
    noMatch.textContent = "No chart\u2019s metric holds \u201c" + text + "\u201d.";
  }

  function anyActive() { return data.runs.some(function (run) { return run.active; }); }

  function refresh() {
    if (document.visibilityState !== "visible") return schedule();
    window.TemperPageAgain()
      .then(function (fresh) {
        var freshData = fresh && fresh.getElementById("compare-data");
        if (!freshData) return;
        data = JSON.parse(freshData.textContent);
        charts = chartsOf();
        withLegend = legendCharts(charts);
        ["compare-finals", "compare-hyperparameters", "compare-generations"].forEach(function (id) {
          var current = document.getElementById(id), replacement = fresh.getElementById(id);
          if (current && replacement) current.replaceWith(document.importNode(replacement, true));
        });
        window.TemperHyperparameters.draw();
        sortFinals();
        document.getElementById("no-metrics").hidden = data.names.length > 0;
        draw();
        showNoMatch();
      })
      .catch(function () {})  // asked again at the next tick
      .then(schedule);
  }

  // Every 30 s otherwise: a teammate may resume or retry one of the runs.
  function schedule() { setTimeout(refresh, anyActive() ? LIVE_MS : IDLE_MS); }

  // The view's settings are kept in the address (x and log by static/plot_axis.js, ema, config, hide, hidegroups (group
  // labels have no comma: static/metric_groups.js), charts), so that a link to the page opens
  // this view; a value no control offers is left at the control's default.
  var differencesOnly = document.getElementById("differences-only");
  function showDifferences() {
    document.getElementById("diff-table").classList.toggle("only-differences", differencesOnly.checked);
  }
  var asked = new URLSearchParams(window.location.search);
  axes.keepChoices(xAxis, logY, draw);
  var askedWeight = Number(asked.get("ema"));
  if (asked.get("ema") && askedWeight >= Number(ema.min) && askedWeight <= Number(ema.max)) ema.value = asked.get("ema");
  if (asked.get("config") === "all") differencesOnly.checked = false;
  chartFilter.value = asked.get("charts") || "";
  showDifferences();
  hidden.restore(data.runs.map(function (run) { return run.id; }));
  hiddenGroups.restore(groupLabels());

  ema.addEventListener("input", function () {
    window.TemperKeepInAddress("ema", Number(ema.value) ? ema.value : null);
    draw();
  });
  differencesOnly.addEventListener("change", function () {
    window.TemperKeepInAddress("config", differencesOnly.checked ? null : "all");
    showDifferences();
  });
  chartFilter.addEventListener("input", function () {
    window.TemperKeepInAddress("charts", chartFilter.value.trim() ? chartFilter.value : null);
    draw();
    showNoMatch();
  });
  // The final metrics sorted by a column (finals=<column>, -<column> the other way; #run: by the runs' names), again
  // each time the page is read again. A column is sorted best first (data-best: lowest, highest), a second click the
  // other way; runs without a value come last either way, ties in the page's order.
  var finalsOrder = asked.get("finals") || "";
  function sortFinals() {
    var table = document.querySelector("#compare-finals .final-table");
    if (!table) return;
    var descending = finalsOrder.charAt(0) === "-", key = descending ? finalsOrder.slice(1) : finalsOrder;
    var headers = Array.prototype.slice.call(table.tHead.rows[0].cells), body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.forEach(function (row, index) { if (row.dataset.position === undefined) row.dataset.position = index; });
    var column = headers.findIndex(function (header) { return header.dataset.sort === key; });
    headers.forEach(function (header, index) {
      if (index === column) header.setAttribute("aria-sort", descending ? "descending" : "ascending");
      else header.removeAttribute("aria-sort");
    });
    function valueOf(row) {
      var cell = row.cells[column];
      if (column === 0) return cell.querySelector("a").textContent;
      return cell.dataset.value === "" ? null : Number(cell.dataset.value);
    }
    rows.sort(function (a, b) {
      var position = Number(a.dataset.position) - Number(b.dataset.position);
      if (column < 0) return position;
      var x = valueOf(a), y = valueOf(b);
      if (x === null || y === null) return x === y ? position : (x === null ? 1 : -1);
      var order = column === 0 ? x.localeCompare(y) : x - y;
      return (descending ? -order : order) || position;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest("#compare-finals button.sort-final");
    if (!button) return;
    var header = button.closest("th"), key = header.dataset.sort;
    var current = finalsOrder.charAt(0) === "-" ? finalsOrder.slice(1) : finalsOrder;
    var descending = key === current ? finalsOrder.charAt(0) !== "-" : header.dataset.best === "highest";
    finalsOrder = (descending ? "-" : "") + key;
    window.TemperKeepInAddress("finals", finalsOrder);
    sortFinals();
  });
  sortFinals();

  // The generations side by side, each run at the step picked in its column (the server's, from gen=<run id>:<step>,
  // comma-separated; a run at its last step is left out of it): read again at once, the address kept.
  document.addEventListener("change", function (event) {
    if (!event.target.matches("select.generation-step")) return;
    var picked = Array.prototype.filter.call(document.querySelectorAll("select.generation-step"), function (select) {
      return select.selectedIndex !== select.options.length - 1;
    }).map(function (select) { return select.dataset.run + ":" + select.value; });
    window.TemperKeepInAddress("gen", picked.length ? picked.join(",") : null);
    window.TemperPageAgain().then(function (fresh) {
      var current = document.getElementById("compare-generations"), replacement = fresh && fresh.getElementById("compare-generations");
      if (current && replacement) current.replaceWith(document.importNode(replacement, true));
    });
  });
  draw();
  showNoMatch();
  schedule();
})();
