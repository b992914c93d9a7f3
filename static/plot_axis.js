/* The y axis of a chart whose points all have one value. Plotly's autorange pads such a series by 1
   whatever its size, so a constant learning rate of 1e-4 was drawn on an axis from -1 to 1, its line
   on the zero, and read as 0. Such a chart gets an axis of half the value either side of it (1 either
   side of 0; half a decade either side on a log axis) instead; any other chart keeps plotly's own. */
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

  return {
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
