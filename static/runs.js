/* The run page: one plotly chart per logged metric (drawn when it comes near the screen), extended in place as points arrive over
   server-sent events (or, when those do not get through, by polling the state endpoint); the
   progress bar, log tail, samples browser and checkpoints (a finished run's page listens while one of
   its checkpoints is being exported; serving copies being written are followed by static/serving_copy.js).
   Every text from the server is set with textContent.
   A run with data.eval_group_by logs eval/<metric>/<group>: those share one chart per metric,
   a line per group (static/metric_groups.js), and the chart of eval/<metric> itself stays as it is. A click on a group
   in a legend hides it in every chart by group, kept in the address (hidegroups=) and shown again by "Show the N hidden
   groups", as on the compare page and by the same code (static/plot_legend.js).
   Steps that could not train (every group's rewards equal, or nothing in the loss) are shaded on the loss and
   reward charts and counted above them: the server's count (selectors.no_learning_signal) plus live steps.
   The smoothing slider draws each single-line chart's EMA (static/plot_smoothing.js) over its points, which stay,
   faint, for the hover and the samples a click opens; it is kept in the address (ema=).
   The charts are drawn by step, tokens or time, linear or on a log scale, as on the compare page and by the same
   code (static/plot_axis.js, which keeps the choice in the address); each line keeps its points' steps, tokens and
   times (`positions`), so that a new choice redraws it and a click opens its point's step whatever the x axis.
   The no-signal shading marks steps: on the tokens and time axes its bands are placed by the chart's own points. */
(function () {
  "use strict";

  var config = document.getElementById("run-config");
  if (!config) return;
  var series = JSON.parse(document.getElementById("run-series").textContent);
  var progress = JSON.parse(document.getElementById("run-progress").textContent);
  var shownStatus = progress.status;  // the status this page was rendered for
  var shownStopping = Boolean(progress.stopping);  // and whether it showed the run stopping (a cancel asked)
  var chartsElement = document.getElementById("charts");
  var charts = {};          // metric name (or "<metric> by <column>") -> plot element
  var lastStep = {};        // metric name -> highest step drawn
  var groupTrace = {};      // grouped metric name -> its trace's index in the group chart
  var groupBy = config.dataset.evalGroupBy || "";
  var lastLogId = 0;
  var pollTimer = null;
  var source = null;
  // A metric's or a group's name as plotly shows it: as text, never as its tags (static/plot_text.js).
  var literal = window.TemperPlotText.literal;
  var axes = window.TemperPlotAxis;
  var xAxis = document.getElementById("x-axis"), logY = document.getElementById("log-y");
  // plot element -> for each of its traces but the smoothed one (in their order), the steps, tokens and times of its
  // points: what the x axis is drawn by, and the steps a click and the chart's words go by.
  var positions = new Map();
  // The wall time the points' times count from (selectors.series_start_time): the live points carry wall times.
  var startTime = chartsElement.dataset.startTime === "" ? null : Number(chartsElement.dataset.startTime);
  var NOTE_ROOM = 16;  // pixels of a line of a chart's title (the log axis's note)
  var hiddenGroups = window.TemperPlotLegend.hiddenKeys({ button: document.getElementById("show-all-groups"),
                                                          noun: "group", parameter: "hidegroups", holder: chartsElement,
                                                          redraw: showGroups });

  function layoutFor(name) {
    return {
      height: 240, margin: Object.assign({ t: 28, b: 36 }, axes.SIDE_MARGINS),
      title: { text: literal(name), font: { size: 13 } },
      // A chart by group is read across its groups at one step, a smoothed one as its value and its smoothed value
      // there (as on the compare page): the hover lists every line at that x, under its title (chosenLayout).
      hovermode: "x unified", hoverlabel: { bgcolor: "#ffffff" },  // its box: the chart's own background is transparent
      xaxis: { title: { text: "step" }, zeroline: false },
      yaxis: { zeroline: false, title: { text: window.TemperPlotAxis.unitOf(name) } },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { size: 11 }, showlegend: false,
    };
  }

  // Smoothing: a single-line chart (ensureChart's) gets a second trace, its points' EMA, computed again from every
  // point each time points come; its own points go faint. Group charts (a line per group) stay as they are.
  var SMOOTHED = "smoothed";  // the smoothed trace's uid
  var emaInput = document.getElementById("run-ema");
  var askedWeight = Number(new URLSearchParams(window.location.search).get("ema"));
  if (askedWeight > 0 && askedWeight <= Number(emaInput.max)) emaInput.value = askedWeight;
  function smoothingWeight() { return Number(emaInput.value); }

  // ``redrawn``: the chart is drawn again (fitView's ``again``) right after, so its traces are changed in place for that
  // drawing. Redrawn first by plotly on its own, the smoothed line of a chart whose x axis was just chosen was drawn
  // on the old one, and the chart's drawing on the new one found no trace changed, fitted no axis to them and drew
  // plotly's default x axis, -1 to 6, far from the points.
  function smoothChart(plot, redrawn) {
    if (!plot.dataset.single) return;
    var figure = undrawn.get(plot), traces = figure ? figure.traces : plot.data, weight = smoothingWeight();
    var points = traces[0], smoothed = traces[1], inPlace = Boolean(figure || redrawn);
    if (!weight) {
      if (!smoothed) return;
      if (inPlace) traces.splice(1, 1); else window.Plotly.deleteTraces(plot, 1);
      if (inPlace) points.opacity = 1; else window.Plotly.restyle(plot, { opacity: 1 }, [0]);
      return;
    }
    var xs = Array.prototype.slice.call(points.x), ys = window.TemperSmoothing.ema(Array.prototype.slice.call(points.y), weight);
    var written = axes.formatValues(ys);
    if (inPlace) {
      points.opacity = 0.3;
      if (smoothed) Object.assign(smoothed, { x: xs, y: ys, customdata: written });
      else traces.push(smoothedTrace(xs, ys));
      return;
    }
    window.Plotly.restyle(plot, { opacity: 0.3 }, [0]);
    if (smoothed) window.Plotly.restyle(plot, { x: [xs], y: [ys], customdata: [written] }, [1]);
    else window.Plotly.addTraces(plot, smoothedTrace(xs, ys));
  }

  function smoothedTrace(xs, ys) {
    return { uid: SMOOTHED, name: "smoothed", x: xs, y: ys, customdata: axes.formatValues(ys), type: "scatter",
      mode: "lines", line: { color: "#4f46e5", width: 2 }, hovertemplate: axes.HOVER_TEMPLATE };
  }

  function showSmoothing() {
    document.getElementById("run-ema-value").textContent = smoothingWeight().toFixed(2);
    Object.keys(charts).forEach(function (key) { smoothChart(charts[key]); });
  }
  emaInput.addEventListener("input", function () {
    window.TemperKeepInAddress("ema", smoothingWeight() ? emaInput.value : null);
    showSmoothing();
  });

  // A chart is drawn when it comes near the screen. A GRPO run logs 30 and more metrics, and drawing
  // every chart before the page answered took 1.45 s. Until it is drawn, a chart's traces and layout
  // wait in `undrawn` (plot element -> { traces, layout }), where new points are added to them.
  var undrawn = new Map();
  var nearScreen = "IntersectionObserver" in window ? new IntersectionObserver(function (entries) {
    entries.forEach(function (entry) { if (entry.isIntersecting) drawChart(entry.target); });
  }, { rootMargin: "600px 0px" }) : null;

  function drawChart(plot) {
    var figure = undrawn.get(plot);
    if (!figure) return;
    undrawn.delete(plot);
    if (nearScreen) nearScreen.unobserve(plot);
    plot.style.minHeight = "";
    var chosen = chosenLayout(plot, figure.traces);
    plot.dataset.view = JSON.stringify(chosen);
    window.Plotly.newPlot(plot, figure.traces, Object.assign(figure.layout, chosen), axes.PLOT_CONFIG);
    describeChart(plot);
    axes.keepZoom(plot);
    axes.fitTicks(plot);
    window.TemperPlotLegend.follow(plot, plot.dataset.grouped ? function (curveNumber, alone) {
      var label = plot.data[curveNumber].meta;
      if (alone) hiddenGroups.showAlone(label, groupLabels()); else hiddenGroups.toggle(label);
    } : null);
    plot.on("plotly_click", function (event) {
      if (!event.points || !event.points.length) return;
      var point = event.points[0];  // a smoothed point is its chart's point at the same index
      var steps = positions.get(plot)[plot.dataset.single ? 0 : point.curveNumber].step;
      loadSamples(Object.assign(sampleFilters(), { step: steps[point.pointIndex] }));
    });
  }

  // The parts of a chart's layout that its points, the x axis and the log scale decide: its title (with the log
  // axis's notes, as on the compare page), its axes, and the no-signal shading of the loss and reward charts.
  // The axes are of the lines shown: a hidden group's values neither stretch nor pin them.
  function chosenLayout(plot, allTraces) {
    var traces = allTraces.filter(function (trace) { return trace.visible !== "legendonly"; });
    var points = traces.filter(function (trace) { return trace.uid !== SMOOTHED; }), key = plot.dataset.metric;
    var log = axes.logApplies(points, logY.checked), title = axes.title(key, points, logY.checked);
    var titleRoom = (title.lines - 1) * NOTE_ROOM, revision = axes.viewRevision(xAxis.value, logY.checked);
    var chosen = {
      height: Number(plot.dataset.height) + titleRoom,
      margin: Object.assign({ t: 28 + titleRoom, b: 36 }, axes.SIDE_MARGINS),
      title: { text: title.text, font: { size: 13 } },
      uirevision: revision,  // the reader's zoom lasts across redraws
      // The hover's title is the x axis's (static/plot_axis.js); each line's value is under it, named, as plot_axis
      // writes it (each trace's customdata: its values so written).
      xaxis: Object.assign({ zeroline: false }, axes.xAxis(xAxis.value, traces, plot)),
      yaxis: Object.assign(axes.yAxis(key, traces, log, axes.zoomedY(plot, revision)), { zeroline: false }),
    };
    if (SHADED_CHARTS.indexOf(key) >= 0) chosen.shapes = noSignalShapes(positions.get(plot)[0]);
    return chosen;
  }

  // A drawn chart's layout made what its points and the choices now ask (chosenLayout), redrawn only where that
  // changed (or ``again``: its traces' x were replaced), since live points come to 30 and more charts each step.
  function fitView(plot, again) {
    var figure = undrawn.get(plot), traces = figure ? figure.traces : plot.data, chosen = chosenLayout(plot, traces);
    if (figure) { Object.assign(figure.layout, chosen); return; }
    var view = JSON.stringify(chosen);
    if (!again && view === plot.dataset.view) return;
    plot.dataset.view = view;
    window.Plotly.react(plot, plot.data.slice(), axes.withShownRange(plot, Object.assign({}, plot.layout, chosen)));
  }

  // Each line's x by the axis chosen, from its points' positions (the smoothed line follows in smoothChart).
  function placeTraces(plot) {
    var figure = undrawn.get(plot), traces = figure ? figure.traces : plot.data, records = positions.get(plot);
    traces.forEach(function (trace, index) {
      if (trace.uid === SMOOTHED) return;
      trace.x = records[index][xAxis.value].slice();
    });
  }

  function showChoices() {
    Object.keys(charts).forEach(function (key) {
      placeTraces(charts[key]);
      smoothChart(charts[key], true);
      fitView(charts[key], true);
    });
  }
  axes.keepChoices(xAxis, logY, showChoices);

  // selectors.chart_order: training metrics, then eval/ ones, each led by LEADING_CHARTS, the rest by name.
  // A metric first logged after the page was drawn (a GRPO run's reward at its first step) takes its place.
  var leadingCharts = JSON.parse(chartsElement.dataset.leading || "[]");

  function chartRank(key) {
    var isEval = key.indexOf("eval/") === 0;
    var leading = leadingCharts.indexOf(isEval ? key.slice(5) : key);
    return [isEval ? 1 : 0, leading < 0 ? leadingCharts.length : leading, key];
  }

  function firstChartAfter(key) {
    var rank = chartRank(key);
    var figures = chartsElement.querySelectorAll("figure.chart");
    for (var index = 0; index < figures.length; index++) {
      var other = chartRank(figures[index].querySelector(".plot").dataset.metric);
      for (var part = 0; part < 3; part++) {
        if (other[part] !== rank[part]) {
          if (other[part] > rank[part]) return figures[index];
          break;
        }
      }
    }
    return null;
  }

  function newChart(key, traces, layout) {
    var figure = document.createElement("figure");
    figure.className = "chart";
    var plot = document.createElement("div");
    plot.className = "plot";
    plot.dataset.metric = key;
    plot.dataset.height = layout.height;  // without the room of its title's notes (chosenLayout)
    plot.style.minHeight = layout.height + "px";  // its place in the page, kept until it is drawn
    var caption = document.createElement("figcaption");
    caption.className = "visually-hidden";
    var download = window.TemperPlotDownload.button(plot, key, chartsElement.dataset.downloadName, function () {
      drawChart(plot);
    });
    figure.append(plot, download, caption);
    chartsElement.insertBefore(figure, firstChartAfter(key));
    charts[key] = plot;
    positions.set(plot, traces.map(noPositions));
    undrawn.set(plot, { traces: traces, layout: layout });
    if (nearScreen) nearScreen.observe(plot); else drawChart(plot);
    describeChart(plot);
    document.getElementById("no-metrics").hidden = true;
    return plot;
  }

  function noPositions() { return { step: [], tokens: [], time: [] }; }

  // A chart's numbers in words, its figure's caption (and so its name) for screen readers: plotly's SVG of
  // ticks and paths reads as noise, so the plot itself is hidden from them but its legend's entries
  // (static/plot_legend.js). Its values are written as the chart writes them (static/plot_axis.js: formatValue), where
  // they had a digit more. Not live: it changes each step.
  function describeChart(plot) {
    var figure = undrawn.get(plot);
    var traces = figure ? figure.traces : plot.data;
    var records = positions.get(plot);
    var lines = traces.map(function (trace, index) { return { trace: trace, steps: (records[index] || {}).step }; })
      .filter(function (line) { return line.trace.uid !== SMOOTHED && line.steps.length; }).map(function (line) {
      var trace = line.trace, steps = line.steps, last = steps.length - 1, lowest = Infinity, highest = -Infinity;
      Array.prototype.forEach.call(trace.y, function (value) {
        lowest = Math.min(lowest, value); highest = Math.max(highest, value);
      });
      var points = steps.length === 1 ? "1 point, step " + steps[0]
        : steps.length + " points, steps " + steps[0] + " to " + steps[last];
      return (trace.meta ? trace.meta + ": " : "") + points + "; latest " + axes.formatValue(trace.y[last]) +
        " at step " + steps[last] + "; lowest " + axes.formatValue(lowest) + ", highest " + axes.formatValue(highest);
    });
    plot.parentNode.querySelector("figcaption").textContent =
      plot.dataset.metric + " by step: " + (lines.length ? lines.join(". ") : "no points yet") + ".";
  }

  function traceCount(plot) { return tracesOf(plot).length; }

  function addTrace(plot, trace) {
    var figure = undrawn.get(plot);
    positions.get(plot).push(noPositions());
    if (figure) figure.traces.push(trace); else window.Plotly.addTraces(plot, trace);
    describeChart(plot);
  }

  // ``points``: {step, tokens, time, value} of the new points, in step order.
  function extendTrace(plot, index, points) {
    var figure = undrawn.get(plot), record = positions.get(plot)[index];
    ["step", "tokens", "time"].forEach(function (key) { Array.prototype.push.apply(record[key], points[key]); });
    var xs = points[xAxis.value], ys = points.value, written = axes.formatValues(ys);
    if (figure) {
      Array.prototype.push.apply(figure.traces[index].x, xs);
      Array.prototype.push.apply(figure.traces[index].y, ys);
      Array.prototype.push.apply(figure.traces[index].customdata, written);
      smoothChart(plot);
      describeChart(plot);
      return;
    }
    window.Plotly.extendTraces(plot, { x: [xs], y: [ys], customdata: [written] }, [index]);
    smoothChart(plot);
    fitView(plot);
    describeChart(plot);
  }

  function ensureChart(name) {
    if (charts[name]) return charts[name];
    lastStep[name] = -1;  // before step 0
    var layout = layoutFor(name);
    var points = { name: "value", x: [], y: [], customdata: [], type: "scatter", marker: { size: 3 },
      line: { color: "#4f46e5", width: 1.5 }, hovertemplate: axes.HOVER_TEMPLATE };
    var plot = newChart(name, [points], layout);
    plot.dataset.single = "1";
    return plot;
  }

  // Steps without learning signal: {ranges: [[first, last], ...], count, steps, through} as the server
  // counted them up to step `through`; a later step counts once its grad_norm (every training step logs
  // one) comes, and is flagged when that is 0 or its frac_reward_zero_std is 1.
  var SHADED_CHARTS = ["loss", "reward"];
  var noSignal = JSON.parse(document.getElementById("run-no-signal").textContent);
  var flaggedLive = {};  // step -> true, for steps after noSignal.through

  // The bands of the no-signal steps on the x axis chosen, of a chart whose line's points are at ``record``'s steps,
  // tokens and times. A band spans its steps and half a step either side; on the tokens and time axes those ends are
  // placed as the chart's points place steps (xOfStep), so that it covers the same points on every axis.
  function noSignalShapes(record) {
    var axis = xAxis.value;
    return noSignal.ranges.map(function (range) {
      return { type: "rect", xref: "x", yref: "paper", x0: xOfStep(record, axis, range[0] - 0.5),
        x1: xOfStep(record, axis, range[1] + 0.5), y0: 0, y1: 1, fillcolor: "rgba(217, 45, 32, 0.16)",
        line: { width: 0 }, layer: "below" };
    }).filter(function (shape) { return shape.x0 !== null; });
  }

  // Where ``step`` (a whole step or half-way between two) lies on ``axis`` (step, tokens or time) by the points of
  // ``record``: between the two points around it in proportion, past the first or last point as the nearest two go
  // on; null by tokens or time with no point to place it by (one point: its own place, a band of no width).
  function xOfStep(record, axis, step) {
    var steps = record.step, xs = record[axis];
    if (axis === "step") return step;
    if (!steps.length) return null;
    if (steps.length === 1) return xs[0];
    var low = 0, high = steps.length - 2;  // the segment [steps[low], steps[low + 1]] that ``step`` falls in or nearest
    while (low < high) {
      var middle = (low + high + 1) >> 1;
      if (steps[middle] <= step) low = middle; else high = middle - 1;
    }
    var span = steps[low + 1] - steps[low];
    return span ? xs[low] + (xs[low + 1] - xs[low]) * (step - steps[low]) / span : xs[low];
  }

  function flagStep(step) {
    if (flaggedLive[step]) return;
    flaggedLive[step] = true;
    noSignal.count += 1;
    var ranges = noSignal.ranges, last = ranges[ranges.length - 1];
    if (last && last[1] === step - 1) last[1] = step;
    else {
      ranges.push([step, step]);
      ranges.sort(function (a, b) { return a[0] - b[0]; });
    }
  }

  // Whether the point changed what is shown (a step counted or flagged).
  function noteSignal(name, step, value) {
    if (step <= noSignal.through) return false;  // the server counted it
    if (name === "grad_norm") {
      noSignal.steps += 1;
      if (value === 0) flagStep(step);
      return true;
    }
    if (name === "frac_reward_zero_std" && value >= 1 && !flaggedLive[step]) {
      flagStep(step);
      return true;
    }
    return false;
  }

  function showNoSignal() {
    document.getElementById("no-signal-count").textContent = noSignal.count;
    document.getElementById("no-signal-steps").textContent = noSignal.steps;
    document.getElementById("no-signal").hidden = noSignal.count === 0;
    SHADED_CHARTS.forEach(function (name) {
      var plot = charts[name];
      if (!plot) return;
      fitView(plot);
    });
  }

  // The chart of eval/<metric>/<group> and the index of that group's line in it (added when first seen).
  function groupTraceFor(name, group) {
    var key = group.chart;
    var plot = charts[key];
    if (!plot) {
      plot = newChart(key, [], Object.assign(layoutFor(key), { height: 260, showlegend: true,
                                                          legend: window.TemperPlotLegend.layout() }));
      plot.dataset.grouped = "1";
    }
    if (!(name in groupTrace)) {
      groupTrace[name] = traceCount(plot);
      lastStep[name] = -1;  // before step 0
      var line = { x: [], y: [], customdata: [], name: literal(group.label), meta: group.label,
        legendgroup: window.TemperPlotLegend.group(group.label), type: "scatter",
        marker: { size: 3 }, line: { width: 1.5 }, hovertemplate: axes.HOVER_TEMPLATE,
        visible: hiddenGroups.has(group.label) ? "legendonly" : true };
      addTrace(plot, line);
    }
    return { plot: plot, index: groupTrace[name] };
  }

  function groupCharts() {
    return Object.keys(charts).map(function (key) { return charts[key]; }).filter(function (plot) { return plot.dataset.grouped; });
  }

  function tracesOf(plot) {
    var figure = undrawn.get(plot);
    return figure ? figure.traces : plot.data;
  }

  // The labels of the groups drawn, in every chart by group (a trace's meta: its group's label).
  function groupLabels() {
    return groupCharts().reduce(function (labels, plot) {
      return labels.concat(tracesOf(plot).map(function (trace) { return trace.meta; })
        .filter(function (label) { return labels.indexOf(label) < 0; }));
    }, []);
  }

  // Each chart by group's lines shown or hidden as hiddenGroups says, its axes fitted to those shown.
  function showGroups() {
    groupCharts().forEach(function (plot) {
      var visible = tracesOf(plot).map(function (trace) { return hiddenGroups.has(trace.meta) ? "legendonly" : true; });
      if (undrawn.has(plot)) tracesOf(plot).forEach(function (trace, index) { trace.visible = visible[index]; });
      else window.Plotly.restyle(plot, { visible: visible });
      fitView(plot);
    });
  }

  // Append points (``entry``: {step, value, tokens, time}, sorted by step) newer than what a chart already shows.
  function addPoints(name, entry) {
    var group = window.TemperMetricGroups.groupOf(name, groupBy);
    var target = group ? groupTraceFor(name, group) : { plot: ensureChart(name), index: 0 };
    var added = { step: [], value: [], tokens: [], time: [] }, signalChanged = false;
    for (var i = 0; i < entry.step.length; i++) {
      if (entry.step[i] > lastStep[name]) {
        Object.keys(added).forEach(function (key) { added[key].push(entry[key][i]); });
        lastStep[name] = entry.step[i];
        if (noteSignal(name, entry.step[i], entry.value[i])) signalChanged = true;
      }
    }
    if (!added.step.length) return;
    extendTrace(target.plot, target.index, added);
    if (signalChanged) showNoSignal();
  }

  function addSeries(seriesByName) {
    Object.keys(seriesByName).forEach(function (name) {
      addPoints(name, seriesByName[name]);
    });
  }

  // Live points are drawn once a frame, however many events came since the last: each event's points drawn as it
  // came cost a plotly redraw per chart, which a loaded machine's page fell behind on, until its queue of events
  // kept it from answering (a click on Cancel… included) for tens of seconds. A hidden page gets no frames: it draws
  // each second. (No trace sets a mode: plotly's own draws markers on lines of under 20 points alone, the SVG node
  // and styling per point that made a redraw of a long run's charts slow.)
  var livePoints = [], liveDrawAsked = false;

  function queueEventPoints(points) {
    Array.prototype.push.apply(livePoints, points);
    if (liveDrawAsked) return;
    liveDrawAsked = true;
    var draw = function () {
      var drawn = livePoints;
      livePoints = [];
      liveDrawAsked = false;
      addEventPoints(drawn);
    };
    if (document.hidden) setTimeout(draw, 1000); else window.requestAnimationFrame(draw);
  }

  function addEventPoints(points) {
    var grouped = {};
    if (startTime === null && points.length) {  // the run's first points (a catch-up would have told the start)
      startTime = Math.min.apply(null, points.map(function (point) { return point.wall_time; }));
    }
    points.forEach(function (point) {
      var entry = grouped[point.name] || (grouped[point.name] = { step: [], value: [], tokens: [], time: [] });
      entry.step.push(point.step);
      entry.value.push(point.value);
      entry.tokens.push(point.tokens);
      entry.time.push(Math.round((point.wall_time - startTime) * 1000) / 1000);  // as selectors._series rounds it
    });
    addSeries(grouped);
  }

  function formatDuration(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "—";
    seconds = Math.round(seconds);
    var hours = Math.floor(seconds / 3600), minutes = Math.floor((seconds % 3600) / 60), secs = seconds % 60;
    if (hours) return hours + "h " + minutes + "m";
    if (minutes) return minutes + "m " + secs + "s";
    return secs + "s";
  }

  // The ETA's pace: the seconds a step since the first step this page saw a worker end, not the run's
  // average, whose first step holds the compilation (minutes on an accelerator, and again at each resume):
  // a run of minutes read hours to go for a long while. Until then, the average is all there is.
  var loadedStep = progress.step;
  var paceFrom = null;  // {step, seconds} of that first step

  function secondsPerStep() {
    if (paceFrom === null && progress.status === "running" && progress.step > loadedStep) {
      paceFrom = { step: progress.step, seconds: progress.train_seconds };
    }
    if (paceFrom !== null && progress.step > paceFrom.step) {
      return (progress.train_seconds - paceFrom.seconds) / (progress.step - paceFrom.step);
    }
    return progress.step ? progress.train_seconds / progress.step : null;
  }

  // An evaluation runs before its step is reported (a minute and more over a large eval set): said next to
  // the step until that step's progress comes.
  // A page loaded mid-evaluation says it from the start (data-step: selectors.run_evaluating).
  var evaluatingShown = document.getElementById("progress-evaluating");
  var evaluatingStep = evaluatingShown && evaluatingShown.dataset.step ? Number(evaluatingShown.dataset.step) : null;
  function showEvaluating(event) {
    if (event.step <= progress.step) return;  // a late event of an evaluation already reported
    evaluatingStep = event.step;
    var element = document.getElementById("progress-evaluating");
    element.textContent = "evaluating step " + event.step + (event.generating ? " (generating samples)" :
      " (" + event.batches_done + "/" + event.batches + " batches)");
    element.hidden = false;
  }

  // As the page's |grouped filter writes a count: 10,838.
  function grouped(count) {
    return typeof count === "number" ? count.toLocaleString("en-US") : count;
  }

  // A run starting (its worker loading the model and compiling, no step reported yet): the card says so, and Elapsed
  // counts from the attempt's start, by this page's clock from the seconds the server counted when it answered.
  var startingSince = null;  // {seconds, at}: attempt_seconds as served, and performance.now() then
  var startingTimer = null;

  function showElapsed() {
    var seconds = progress.train_seconds;
    if (progress.starting && startingSince !== null) {
      seconds += startingSince.seconds + (performance.now() - startingSince.at) / 1000;
    }
    document.getElementById("progress-elapsed").textContent = formatDuration(seconds);
  }

  function showStarting() {
    var starting = Boolean(progress.starting) && progress.status === "running";
    document.getElementById("progress-starting").hidden = !starting;
    if (starting && startingTimer === null) startingTimer = setInterval(showElapsed, 1000);
    if (!starting && startingTimer !== null) { clearInterval(startingTimer); startingTimer = null; }
  }

  function showProgress(state) {
    if (state.attempt_seconds !== undefined && state.attempt_seconds !== null) {
      startingSince = { seconds: state.attempt_seconds, at: performance.now() };
    }
    progress = Object.assign(progress, state);
    if (evaluatingStep !== null && progress.step >= evaluatingStep) {
      evaluatingStep = null;
      document.getElementById("progress-evaluating").hidden = true;
    }
    var total = progress.total_steps || 0;
    document.getElementById("progress-step").textContent = grouped(progress.step);
    document.getElementById("progress-total").textContent = total ? grouped(total) : "?";
    document.getElementById("progress-tokens").textContent = grouped(progress.tokens);
    showElapsed();
    if (progress.tokens_per_second !== null && progress.tokens_per_second !== undefined) {
      document.getElementById("progress-speed").textContent = Math.round(progress.tokens_per_second);
    }
    var pace = secondsPerStep();
    var eta = total && pace !== null ? (total - progress.step) * pace : null;
    // Only a running run has time left: a cancelled or failed one stays where it stopped.
    document.getElementById("progress-eta").textContent =
      progress.status !== "running" || progress.step >= total ? "—" : formatDuration(eta);
    var bar = document.querySelector("#progress .bar");
    bar.setAttribute("aria-valuenow", progress.step);
    bar.setAttribute("aria-valuemax", total);
    document.querySelector("#progress .bar-fill").style.width = (total ? Math.min(100, 100 * progress.step / total) : 0) + "%";
    showStarting();
  }

  function addLogLines(lines) {
    var list = document.getElementById("log");
    lines.forEach(function (line) {
      if (line.id <= lastLogId) return;
      lastLogId = line.id;
      var item = document.createElement("li");
      item.className = "log-" + line.level;
      item.dataset.id = line.id;
      var time = document.createElement("time");
      time.textContent = new Date(line.time).toTimeString().slice(0, 8);
      item.appendChild(time);
      item.appendChild(document.createTextNode(" " + line.message));
      list.appendChild(item);
      document.getElementById("progress-starting-line").textContent = " Latest: " + line.message;
    });
    list.scrollTop = list.scrollHeight;
  }

  // Only the answer to the latest request is put in: answers can come out of order (a step chosen, then
  // another before the first's answer came; a new step's rollouts arriving meanwhile), and the slower,
  // older one landing last showed samples, and filters, that were no longer asked for.
  var samplesRequested = 0;
  var samplesWaiting = false;  // rollouts came while the focus was in the filters (see samplesArrived)
  function loadSamples(params, options) {
    var url = config.dataset.samplesUrl + "?" + new URLSearchParams(params).toString();
    var request = ++samplesRequested;
    samplesWaiting = false;
    return fetch(url, { credentials: "same-origin" }).then(function (response) { return response.text(); })
      .then(function (html) {
        if (request !== samplesRequested) return;
        var holder = document.getElementById("samples");
        holder.innerHTML = html;  // a server-rendered partial: every text in it is escaped by Django
        bindSampleFilter();
        if (!options || options.scroll !== false) holder.scrollIntoView({ behavior: "smooth", block: "start" });
      });
  }

  // The filters chosen in the samples browser, without its step (a chart click or the newest step replaces it).
  function sampleFilters() {
    var form = document.querySelector("#samples form.sample-filter");
    var filters = form ? Object.fromEntries(new FormData(form).entries()) : {};
    delete filters.step;
    return filters;
  }

  function bindSampleFilter() {
    var form = document.querySelector("#samples form.sample-filter");
    if (!form) return;
    // Rollouts that came while someone was in the filters come once the focus leaves them.
    form.addEventListener("focusout", function (event) {
      if (samplesWaiting && !form.contains(event.relatedTarget)) samplesArrived();
    });
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      loadSamples(Object.fromEntries(new FormData(form).entries()));
    });
    // kind and order only where the run's samples are scored (GRPO, PPO).
    form.querySelectorAll("select[name=step], select[name=kind], select[name=order]").forEach(function (select) {
      select.addEventListener("change", function () { form.requestSubmit(); });
    });
    document.querySelectorAll("#samples .sample-pages button[data-page]").forEach(function (button) {
      button.addEventListener("click", function () {
        loadSamples(Object.assign(Object.fromEntries(new FormData(form).entries()), { page: button.dataset.page }));
      });
    });
  }

  // New samples (a GRPO/PPO run logs rollouts every step): follow them only while the newest step
  // is shown, without scrolling the page; a step someone chose stays.
  // Not while the focus is in the filters: the browser put in anew took it from someone typing a reward
  // bound (a GRPO run logs rollouts every step), and what they typed next went nowhere.
  function samplesArrived() {
    var shown = document.querySelector("#samples .samples");
    if (shown && shown.dataset.step && shown.dataset.step !== shown.dataset.lastStep) return;
    var form = document.querySelector("#samples form.sample-filter");
    if (form && form.contains(document.activeElement)) { samplesWaiting = true; return; }
    loadSamples(sampleFilters(), { scroll: false });
  }

  // {step: state} of the checkpoints as shown (the partial's data-state: "", exporting, exported, failed).
  function shownCheckpoints() {
    var shown = {};
    document.querySelectorAll("#checkpoints li[data-step]").forEach(function (item) {
      shown[item.dataset.step] = item.dataset.state;
    });
    return shown;
  }

  function exportRunning() {
    return document.querySelector('#checkpoints li[data-state="exporting"]') !== null;
  }

  // A checkpoint's "Launch a run from it" before its export exports it first and opens this page with
  // ?launch=<step>: the launch form opens with that checkpoint once the list shows it exported. The step is
  // taken out of the address first, so that Back from the form does not open it again; an export that failed
  // takes it out too (its item says why).
  function launchWhenExported() {
    var query = new URLSearchParams(window.location.search);
    var step = query.get("launch");
    if (step === null) return;
    var item = document.querySelector('#checkpoints li[data-step="' + CSS.escape(step) + '"]');
    if (item && item.dataset.state === "exporting") return;
    query.delete("launch");
    var rest = query.toString();
    window.history.replaceState(null, "", window.location.pathname + (rest ? "?" + rest : "") + window.location.hash);
    var link = item && item.dataset.state === "exported" ? item.querySelector("a.launch-from-checkpoint") : null;
    if (link) window.location.assign(link.href);
  }

  function loadCheckpoints() {
    return fetch(config.dataset.checkpointsUrl, { credentials: "same-origin" })
      .then(function (response) { return response.text(); })
      .then(function (html) {
        document.getElementById("checkpoints").innerHTML = html;  // a server-rendered partial, escaped by Django
        launchWhenExported();
        if (config.dataset.active || exportRunning() || !(source || pollTimer)) return;
        stopListening();
        // The catch-up that loaded this partial may have read the log before the last export ended,
        // and that export's own event can now come to a closed stream: read the log once more.
        return catchUp();
      });
  }

  // A catch-up asks for each metric's points after its own last step (after_steps): after the smallest
  // alone, a metric logged rarely (an eval every 500 steps) brought back every other metric's points
  // since its last one. after_step (that smallest) covers the metrics left out: those at it, and any
  // this page has not seen. A list too long for an address (proxies stop near 8 KiB) is left out.
  var AFTER_STEPS_MAX_CHARS = 4000;

  function catchUp() {
    var after = Math.min.apply(null, Object.keys(lastStep).map(function (name) { return lastStep[name]; }).concat([Infinity]));
    var query = new URLSearchParams({ after_step: isFinite(after) ? after : -1, after_log: lastLogId });
    var ahead = {};
    Object.keys(lastStep).forEach(function (name) { if (lastStep[name] > after) ahead[name] = lastStep[name]; });
    var afterSteps = JSON.stringify(ahead);
    if (afterSteps !== "{}" && afterSteps.length <= AFTER_STEPS_MAX_CHARS) query.set("after_steps", afterSteps);
    if (startTime === null) query.set("start_time", "1");
    return fetch(config.dataset.stateUrl + "?" + query.toString(), { credentials: "same-origin" })
      .then(function (response) { return response.json(); })
      .then(function (state) {
        if (startTime === null && state.series_start_time !== undefined) startTime = state.series_start_time;
        addSeries(state.series);
        // A live event may have shown a later step while this was asked: the stored progress lags it.
        if (state.progress.step >= progress.step) showProgress(state.progress);
        addLogLines(state.log);
        if (state.progress.status !== shownStatus || Boolean(state.progress.stopping) !== shownStopping) statusChanged();
        else if (JSON.stringify(state.checkpoints) !== JSON.stringify(shownCheckpoints())) loadCheckpoints();
      });
  }

  function stopListening() {
    if (source) source.close();
    if (pollTimer) clearInterval(pollTimer);
    source = pollTimer = null;
    document.getElementById("live-state").textContent = "";
  }

  // A status changes the badge, the actions and the notes under them (#run-summary), the worker and its
  // devices (#progress) and, once finished, the artifacts (#lineage). Those parts are taken from the page
  // as the server renders it now and swapped in place: loading the page again took a reader back to its
  // top and the focus to its start. The live region says the new status.
  var SWAPPED = ["run-summary", "progress", "lineage"];
  var refreshing = false;

  function statusChanged() {
    if (refreshing) return;  // the page asked for shows this change too; catchUp checks after it
    refreshing = true;
    window.TemperPageAgain()
      .then(function (fresh) {
        if (fresh === null) throw new Error("the run page was not answered");
        showStatus(fresh);
      })
      .catch(function () { window.location.reload(); })  // a page that cannot be swapped is loaded whole
      .then(function () { refreshing = false; });
  }

  // Where the focused control is, to find it again in the swapped parts: its id, or the id of the
  // nearest part holding it with its tag, place and text there (the Cancel… of #cancel-confirm).
  function placeOf(element) {
    var holder = element && element.closest("[id]");
    if (!holder) return null;
    if (holder === element) return { id: element.id };
    return { id: holder.id, tag: element.tagName, text: element.textContent,
             index: Array.prototype.indexOf.call(holder.querySelectorAll(element.tagName), element) };
  }

  function elementAt(place) {
    var holder = document.getElementById(place.id);
    if (!holder || !place.tag) return holder;
    var found = holder.querySelectorAll(place.tag)[place.index];
    return found && found.textContent === place.text ? found : null;
  }

  function showStatus(fresh) {
    var focused = document.activeElement;
    var focusedPlace = placeOf(focused);
    SWAPPED.forEach(function (id) {
      var shown = document.getElementById(id);
      var rendered = fresh.getElementById(id);
      if (shown && rendered) shown.replaceWith(document.adoptNode(rendered));
    });
    if (focused && focused !== document.body && !document.body.contains(focused)) {
      // The control is gone (Cancel… once the run ended): the status it changed takes the focus.
      var again = focusedPlace && elementAt(focusedPlace);
      if (again) again.focus();
      if (!again || document.activeElement !== again) document.getElementById("run-status").focus();
    }
    var served = JSON.parse(fresh.getElementById("run-progress").textContent);
    shownStatus = served.status;
    shownStopping = Boolean(served.stopping);
    // The live events may be ahead of the stored progress: it never takes the steps back.
    showProgress(served.step >= progress.step ? served : { status: served.status, stopping: served.stopping });
    config.dataset.active = fresh.getElementById("run-config").dataset.active;
    document.getElementById("run-status-announcement").textContent =
      "Run status: " + document.getElementById("run-status").textContent.trim() + ".";
    if (config.dataset.active || exportRunning()) {
      if (source || pollTimer) catchUp(); else listen();  // a change that came while this was asked
    } else {
      stopListening();
    }
  }

  function poll() {
    if (pollTimer) return;
    document.getElementById("live-state").textContent = "polling";
    pollTimer = setInterval(catchUp, 2000);
  }

  // A finished run can be resumed or retried by a teammate or from another tab: while shown and not
  // listening, its page asks for its state every 30 s and shows the run again (statusChanged) once it is queued.
  function watchFinished() {
    window.setInterval(function () {
      if (document.visibilityState === "visible" && !source && !pollTimer) catchUp().catch(function () {});
    }, window.TemperRunWatchMs || 30000);  // a test shortens it
  }

  function listen() {
    if (!window.EventSource) { poll(); return; }
    document.getElementById("live-state").textContent = "connecting";  // "live" waits for the hello
    source = new EventSource(config.dataset.eventsUrl);
    source.onmessage = function (message) {
      var event = JSON.parse(message.data);
      // The hello comes once the server listens to the run's channel (the stream's opening comes
      // before): catching up then leaves no gap for an event to fall into.
      if (event.type === "hello") { document.getElementById("live-state").textContent = "live"; catchUp(); }
      else if (event.type === "metrics") queueEventPoints(event.points);
      else if (event.type === "progress") showProgress(Object.assign({ starting: false }, event));  // a step: started
      else if (event.type === "evaluating") showEvaluating(event);
      else if (event.type === "log") addLogLines(event.lines);
      else if (event.type === "samples") samplesArrived();
      else if (event.type === "checkpoint") catchUp();
      else if (event.type === "status" && event.status !== shownStatus) statusChanged();
      else if (event.type === "cancel_requested" && !shownStopping) statusChanged();  // a teammate's Cancel: "stopping"
      else if (event.type === "unavailable") { source.close(); poll(); }
    };
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED) poll();
    };
  }

  document.querySelectorAll("#log li").forEach(function (item) { lastLogId = Math.max(lastLogId, Number(item.dataset.id)); });
  // The log's box opens on its newest lines (the run's end: "cancelled at step 473"), as it follows new ones.
  var logList = document.getElementById("log");
  if (logList) logList.scrollTop = logList.scrollHeight;
  addSeries(series);
  hiddenGroups.restore(groupLabels());  // groups hidden in the address
  showGroups();
  showSmoothing();  // a smoothing asked in the address
  showProgress(progress);
  bindSampleFilter();
  launchWhenExported();
  if (config.dataset.active || exportRunning()) listen();
  watchFinished();
})();
