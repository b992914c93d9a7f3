/* The axes of the run page's and compare page's charts, and how both write a value in a hover and on a y axis
   (formatValue, VALUE_TICK_FORMATS), and a step, a token count or a time on the x axis and in the hover's title
   (X_FORMATS: "1,000,000", as many ticks as fit: xTickCount, counted anew as the chart's width changes: fitTicks).
   The y axis of a chart whose points all have one value. Plotly's autorange pads such a series by 1
   whatever its size, so a constant learning rate of 1e-4 was drawn on an axis from -1 to 1, its line
   on the zero, and read as 0. Such a chart gets an axis of half the value either side of it (1 either
   side of 0; half a decade either side on a log axis) instead; any other chart keeps plotly's own.
   An x axis of steps (or tokens) over fewer than ten of them: plotly ticks a short span in halves (1, 1.5,
   2 …), and a step is a whole number, so it is ticked at each one instead.
   Both pages draw by step, tokens or time and linear or on a log scale, as their #x-axis and #log-y say
   (templates/runs/_axis_controls.html): the axes, the log axis's notes in a chart's title, and the choice kept in
   the address are made here, once for both.
   A reader's zoom lasts while those choices do: both pages redraw a chart with Plotly.react as its points and layout
   change (a live point, a one-value series that starts to vary, another tick mode), which drew the whole run again
   and threw the zoom away. Plotly keeps what the reader changed by hand across a redraw whose layout.uirevision is
   the one before (viewRevision); another x axis or scale changes it, and the chart is drawn whole on the new one.
   It keeps a zoomed axis only while the range the page asks for is the one asked before the zoom, though: a one-value
   chart's axis was an explicit range, and the live point that made the values differ (or changed the one value)
   asked another, which threw the y zoom away. So a linear y axis is always autoranged, a one-value chart's held to
   its range by autorangeoptions, and what the page asks of the range never changes; a double click autoranges anew.
   A log axis of one value keeps its explicit range: plotly 4.1.1 uses autorangeoptions' bounds on a log axis as
   exponents but checks them as values (minallowed and maxallowed are dropped unless both exponents are above 0, include
   is compared with the log of an exponent), so none of them holds it. There the reader's y zoom is kept by hand
   instead (keepZoom: the range of their last zoom, in decades, from plotly's relayout event) and asked for explicitly
   while the view lasts (zoomedY), so that the live point that makes the values differ asks the range shown; a double
   click (autorange) lets it go. */
window.TemperPlotAxis = (function () {
  "use strict";

  // The one finite value every point of ``traces`` has, or null (no points, or several values). Equal
  // within rounding: smoothing a constant series (the compare page's EMA) leaves it off by 1e-20.
  function onlyValue(traces) {
    var value = null;
    for (var t = 0; t < traces.length; t++) {
      var ys = traces[t].y || [];
      for (var i = 0; i < ys.length; i++) {
        if (ys[i] === null || !isFinite(ys[i])) continue;
        if (value === null) value = ys[i];
        else if (Math.abs(ys[i] - value) > 1e-9 * Math.abs(value)) return null;
      }
    }
    return value;
  }

  var WHOLE_TICKS_UNDER = 10;  // a tick per step up to this span; plotly's own, whole from there on

  function xSpan(traces) {
    var low = Infinity, high = -Infinity;
    for (var t = 0; t < traces.length; t++) {
      var xs = traces[t].x || [];
      for (var i = 0; i < xs.length; i++) {
        if (xs[i] < low) low = xs[i];
        if (xs[i] > high) high = xs[i];
      }
    }
    return high >= low ? high - low : 0;
  }

  // A log axis cannot show 0 or less: a chart with no value above 0 (an epoch still 0, an exact match not
  // yet scored) drawn on one was an empty axis from 100 to 10k, read as no data. It stays linear and says so.
  function anyAboveZero(traces) {
    return traces.some(function (each) { return Array.prototype.some.call(each.y || [], function (y) { return y > 0; }); });
  }

  // A log axis leaves out the points at 0 or below of a chart that also has some above; how many is said in
  // its title, since a margin that went negative would otherwise vanish from the chart unnoticed.
  function pointsAtOrBelowZero(traces) {
    return traces.reduce(function (count, each) {
      return count + Array.prototype.filter.call(each.y || [], function (y) { return y !== null && y <= 0; }).length;
    }, 0);
  }

  var X_TITLES = { step: "step", tokens: "tokens", time: "seconds" };

  // The x axis's numbers, on its ticks and in its hover's title (d3 formats): steps and tokens whole, seconds to 6
  // significant digits, each with thousands separators ("5,000", "1,000,000"), where plotly wrote "5k" and "1M" on
  // the ticks and "5000" in the hover. The hover's title says what the number counts.
  var X_FORMATS = { step: ",d", tokens: ",d", time: ",~r" };
  var X_HOVER_TITLES = { step: "step %s", tokens: "%s tokens", time: "%s s" };

  // The charts' left and right margins (pixels; the y axis's numbers and title on the left), on both pages.
  var SIDE_MARGINS = { l: 56, r: 12 };
  var TICK_CHARACTER = 0.62 * 11;  // pixels of a digit of the axis's numbers, at the pages' font size (11), rounded up

  // How many ticks (plotly's nticks) the x axis of ``traces`` takes in ``plot`` so that its numbers, written whole
  // (X_FORMATS), fit side by side: plotly's own count, fewer where its widest numbers would meet (plotly then tilted
  // them over the axis's title). Plotly spaces the ticks at least the axis's length over that count apart. Null for
  // a plot not shown (no width to go by): plotly's own count. Counted as the page draws the chart and again as its
  // width changes (fitTicks). A whole number: plotly's own is a fraction (7.65 at 532 pixels), and plotly takes an
  // nticks that is not whole for its default, the count asked then not the one drawn.
  function xTickCount(plot, traces) {
    var length = plot.clientWidth - SIDE_MARGINS.l - SIDE_MARGINS.r;
    if (length <= 0) return null;
    var largest = 0;
    traces.forEach(function (trace) {
      Array.prototype.forEach.call(trace.x || [], function (x) { largest = Math.max(largest, Math.abs(x)); });
    });
    var widest = Math.round(largest).toLocaleString("en-US").length * TICK_CHARACTER;
    var plotlys = Math.min(Math.max(length / 80, 4), 9) + 1;  // plotly's own: src/plots/cartesian/axes.js autoTicks
    return Math.max(2, Math.floor(Math.min(length / (widest + TICK_CHARACTER), plotlys)));
  }

  // A chart's width changes with the window's (a phone turned, a window narrowed) and with its place's (the compare
  // page's grid of charts): a count made when it was drawn at 1280 pixels put its numbers over each other, tilted,
  // at 390. Each chart drawn is fitted to its place's width and gets its count anew once that width has held still
  // for RESIZE_WAIT (a window dragged wide or narrow resizes it at every frame), by one relayout of its width, its
  // height and its count: the reader's zoom stays. A change of its height alone (the page makes room for a legend)
  // asks for none. Not plotly's resize (Plots.resize, which its config's ``responsive`` calls at each of the window's
  // resizes): it drops the layout's height with its width, and the chart's PNG, drawn from its layout, came out at
  // plotly's default 450 pixels; the height given back by a relayout pins the layout's width as well (plotly sets the
  // other of the two), and plotly's next resize left a chart of set width and height as it was, at its old width,
  // past its place's edge or short of it; and a window made lower alone, no chart's place changed, dropped every
  // chart's height. The width is set here each time the place's changes, which the page's own drawings keep (a
  // Plotly.react whose layout has none keeps the width drawn).
  var RESIZE_WAIT = 100;  // milliseconds
  var placeWidths = new WeakMap(), resized = new Set(), resizeTimer = null;

  // Chart ``plot`` at its place's width (plotly's measure: within a pixel, the one fractional, the other not), at its
  // own height (the layout's; the height drawn where plotly dropped it), its x ticks counted for that width.
  function fitToPlace(plot) {
    if (!plot.isConnected || !plot.layout || !plot.layout.xaxis || plot.clientWidth === 0) return;  // gone, not drawn, hidden
    var count = xTickCount(plot, plot.data.filter(function (each) { return each.visible !== "legendonly"; }));
    var edits = {};
    if (Math.abs(plot._fullLayout.width - plot.clientWidth) > 1) {
      edits.width = plot.clientWidth;
      edits.height = plot.layout.height || plot._fullLayout.height;
    }
    if (count !== null && count !== plot.layout.xaxis.nticks) edits["xaxis.nticks"] = count;
    if (Object.keys(edits).length) window.Plotly.relayout(plot, edits);
  }

  var widths = "ResizeObserver" in window ? new ResizeObserver(function (entries) {
    entries.forEach(function (entry) {
      if (placeWidths.get(entry.target) === entry.contentRect.width) return;
      placeWidths.set(entry.target, entry.contentRect.width);
      resized.add(entry.target);
    });
    if (!resized.size) return;
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () {
      var plots = Array.from(resized);
      resized.clear();
      plots.forEach(fitToPlace);
    }, RESIZE_WAIT);
  }) : null;

  // Where a value is written in exponent form: below the thousandth, from a million on.
  var EXPONENT_BELOW = 1e-3, EXPONENT_FROM = 1e6;
  var SIGNIFICANT_DIGITS = 4;

  // The y axis's numbers written as formatValue writes a value, by the step between two ticks (plotly's own wrote a
  // learning rate's "100μ", a loss's "5k"): ticks closer than a thousandth (or a million apart) in exponent form, those
  // between to the digits they need, whole numbers whole. d3's "~" drops trailing zeros.
  var VALUE_TICK_FORMATS = [
    { dtickrange: [null, EXPONENT_BELOW], value: "~e" },
    { dtickrange: [EXPONENT_BELOW, EXPONENT_FROM], value: "~g" },
    { dtickrange: [EXPONENT_FROM, null], value: "~e" },
  ];

  // ``value`` as a reader reads it off a chart: "5", "12345", "0.1235", "1e-4", "1.23e+6". Plotly's own wrote the run
  // page's hover to 5 significant digits, zeros and all ("5.0000"), and the compare page's to its ticks' precision and
  // more ("0.0001000"); d3's formats (all a hovertemplate takes) cannot keep a whole number whole while they round
  // the others, so each point carries its value so written (customdata).
  function formatValue(value) {
    if (value === null || value === undefined || !isFinite(value)) return String(value);
    var size = Math.abs(value);
    if (size !== 0 && (size < EXPONENT_BELOW || size >= EXPONENT_FROM)) {
      return value.toExponential(SIGNIFICANT_DIGITS - 1).replace(/\.?0+e/, "e");
    }
    if (Number.isInteger(value)) return String(value);
    var wholeDigits = Math.floor(Math.log10(size)) + 1;  // a value's whole part is never rounded: 12345.6 -> 12346
    return String(Number(value.toPrecision(Math.max(SIGNIFICANT_DIGITS, wholeDigits))));
  }

  // plot element -> { revision, range }: the y range of the reader's last zoom (plotly's range: decades on a log axis)
  // and the view (layout.uirevision) it was made in.
  var zoomedYRanges = new WeakMap();

  return {
    // The charts' plotly config. A double click autoranges: plotly's own first went back to the range of the chart's
    // first drawing where that was explicit (a log axis of one value), and the reader's zoom kept by hand (keepZoom)
    // would then have held the chart there as later points came.
    // Sized to its place by fitTicks, not by plotly's ``responsive`` (see fitToPlace), where the browser can tell.
    PLOT_CONFIG: { displayModeBar: false, responsive: !("ResizeObserver" in window), doubleClick: "autosize" },
    formatValue: formatValue,
    // ``values`` written as formatValue writes them: a trace's customdata, which its hover (hoverOf) shows.
    formatValues: function (values) { return Array.prototype.map.call(values, formatValue); },
    // The hovertemplate of a trace whose points carry their values written (formatValues) as their customdata: its
    // name (plotly's, so that a name's "%{…}" is no template) and the value, in a unified hover's list.
    HOVER_TEMPLATE: "%{fullData.name}: %{customdata}<extra></extra>",
    // Whether ``traces`` are drawn on a log axis when one is asked for: only with a value above 0.
    logApplies: function (traces, logAsked) { return Boolean(logAsked) && anyAboveZero(traces); },
    SIDE_MARGINS: SIDE_MARGINS,
    // The x axis by ``axis`` (step, tokens or time) of ``traces`` in chart ``plot``, as layout properties: steps and
    // tokens are whole numbers, seconds are not; its numbers written as X_FORMATS says, as many as fit (xTickCount).
    xAxis: function (axis, traces, plot) {
      var format = X_FORMATS[axis], count = xTickCount(plot, traces);
      return Object.assign({ title: { text: X_TITLES[axis] }, tickformat: format, hoverformat: format,
                             unifiedhovertitle: { text: X_HOVER_TITLES[axis].replace("%s", "%{x:" + format + "}") } },
                           count === null ? {} : { nticks: count },
                           axis === "time" ? { tickmode: "auto" } : this.wholeXTicks(traces));
    },
    // The y axis of metric ``name``'s ``traces``, on a log scale or not (logApplies), as layout properties; a log axis
    // the reader zoomed (``zoomed``: zoomedY's range) stays at that zoom.
    yAxis: function (name, traces, log, zoomed) {
      var range = log && zoomed ? { autorange: false, range: zoomed.slice() } : this.yRange(traces, log);
      return Object.assign({ type: log ? "log" : "linear", title: { text: this.unitOf(name) },
                            tickformatstops: VALUE_TICK_FORMATS }, range);
    },
    // Follow the reader's zooms of drawn chart ``plot`` (once, after its first drawing): the y range they zoomed to,
    // until a double click autoranges it.
    keepZoom: function (plot) {
      plot.on("plotly_relayout", function (edit) {
        if (edit["yaxis.autorange"]) zoomedYRanges.delete(plot);
        var range = edit["yaxis.range"] || ("yaxis.range[0]" in edit ? [edit["yaxis.range[0]"], edit["yaxis.range[1]"]] : null);
        if (range) zoomedYRanges.set(plot, { revision: plot.layout.uirevision, range: range });
      });
    },
    // Fit drawn chart ``plot`` to its place's width and count its x ticks (xTickCount) anew whenever that changes
    // (once, after its first drawing).
    fitTicks: function (plot) { if (widths) widths.observe(plot); },
    // Fit drawn chart ``plot`` to its place now (fitToPlace): one shown again after it was drawn while hidden.
    fitToPlace: fitToPlace,
    // The y range ``plot``'s reader zoomed to in the view ``revision`` (viewRevision) and not autoranged since, or null.
    zoomedY: function (plot, revision) {
      var zoomed = zoomedYRanges.get(plot);
      return zoomed && zoomed.revision === revision ? zoomed.range : null;
    },
    // ``layout``, drawn chart ``plot``'s next, for Plotly.react: an autoranged y axis in the same view carries the range
    // the chart shows. Plotly's react takes an autoranged axis's range from the layout before only where what was asked
    // before the reader's last change of it was autorange too: once a double click had autoranged an axis asked at an
    // explicit range (a log axis of one value, a zoom kept by hand), the next ask of autorange drew it at plotly's
    // default range, -1 to 4 (decades: 0.1 to 10k), far from the points. The range carried is only a start: an
    // autoranged axis is fitted to the points again whenever they change.
    withShownRange: function (plot, layout) {
      var shown = plot.layout && plot.layout.yaxis && plot.layout.yaxis.range;
      if (!shown || layout.yaxis.autorange !== true || plot.layout.uirevision !== layout.uirevision) return layout;
      return Object.assign({}, layout, { yaxis: Object.assign({}, layout.yaxis, { range: shown.slice() }) });
    },
    // A chart's title: its name (text, static/plot_text.js), and under it a line for each note a reader must know to
    // read it (``notes``: a shared chart's metrics) and the points a log axis leaves out. On one line they ran past a
    // phone's chart, cut off at its edges. { text, lines }: the lines make room above the plot.
    title: function (name, traces, logAsked, notes) {
      var literal = window.TemperPlotText.literal, log = this.logApplies(traces, logAsked);
      var text = literal(name), all = (notes || []).slice();
      if (logAsked && !log) text += literal(" (linear: no value above 0)");
      var left = log ? pointsAtOrBelowZero(traces) : 0;
      if (left) all.push("log: " + left + (left === 1 ? " point" : " points") + " at 0 or below not drawn");
      return { text: [text].concat(all.map(literal)).join("<br>"), lines: 1 + all.length };
    },
    // The layout.uirevision of a chart drawn by ``axis`` with the log scale ``logAsked`` or not: the same while the
    // reader's choices are, so that plotly keeps their zoom across a redraw.
    viewRevision: function (axis, logAsked) { return axis + (logAsked ? ",log" : ""); },
    // The x axis and log scale controls (``xSelect``, ``logBox``) set from the address (x=, log=1; a value the select
    // does not offer leaves it at step), kept in it as they change, ``changed`` called then.
    keepChoices: function (xSelect, logBox, changed) {
      var asked = new URLSearchParams(window.location.search);
      if (Array.prototype.some.call(xSelect.options, function (option) { return option.value === asked.get("x"); })) {
        xSelect.value = asked.get("x");
      }
      logBox.checked = asked.get("log") === "1";
      [xSelect, logBox].forEach(function (control) {
        control.addEventListener("input", function () {
          window.TemperKeepInAddress("x", xSelect.value === "step" ? null : xSelect.value);
          window.TemperKeepInAddress("log", logBox.checked ? "1" : null);
          changed();
        });
      });
    },
    // The x axis's ticks for ``traces`` whose x are whole numbers (steps, tokens), as layout properties.
    wholeXTicks: function (traces) {
      return xSpan(traces) < WHOLE_TICKS_UNDER ? { tickmode: "linear", tick0: 0, dtick: 1 } : { tickmode: "auto" };
    },
    // The unit of metric ``name`` when its name does not say it, else "": the page's "metric-units" JSON, a unit by
    // name prefix (webapp/runs/selectors.py: METRIC_UNITS_BY_PREFIX).
    unitOf: function (name) {
      var source = document.getElementById("metric-units"), units = source ? JSON.parse(source.textContent) : {};
      var prefix = Object.keys(units).filter(function (each) { return name.indexOf(each) === 0; })[0];
      return prefix === undefined ? "" : units[prefix];
    },
    // The y axis's range for ``traces`` as layout properties: autorange (held to the range around a one-value
    // chart's value on a linear axis), or a one-value log axis's range.
    yRange: function (traces, logScale) {
      var value = onlyValue(traces);
      if (value === null || (logScale && value <= 0)) return { autorange: true };
      if (logScale) return { autorange: false, range: [Math.log10(value) - 0.5, Math.log10(value) + 0.5] };
      var half = value === 0 ? 1 : Math.abs(value) / 2;
      return { autorange: true, autorangeoptions: { minallowed: value - half, maxallowed: value + half } };
    },
  };
})();
