/* The axes of the run page's and compare page's charts.
   The y axis of a chart whose points all have one value. Plotly's autorange pads such a series by 1
   whatever its size, so a constant learning rate of 1e-4 was drawn on an axis from -1 to 1, its line
   on the zero, and read as 0. Such a chart gets an axis of half the value either side of it (1 either
   side of 0; half a decade either side on a log axis) instead; any other chart keeps plotly's own.
   An x axis of steps (or tokens) over fewer than ten of them: plotly ticks a short span in halves (1, 1.5,
   2 …), and a step is a whole number, so it is ticked at each one instead. */
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

  return {
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
    // The y axis's range for ``traces`` as layout properties: { range: [low, high] } or { autorange: true }.
    yRange: function (traces, logScale) {
      var value = onlyValue(traces);
      if (value === null || (logScale && value <= 0)) return { autorange: true };
      if (logScale) return { range: [Math.log10(value) - 0.5, Math.log10(value) + 0.5] };
      var half = value === 0 ? 1 : Math.abs(value) / 2;
      return { range: [value - half, value + half] };
    },
  };
})();
