/* The compare page's parallel-coordinates chart (webapp/runs/selectors.py: hyperparameter_axes): a
   line per run through the config keys that differ, ending on the run's last value of the chosen
   metric, which also colors the lines. Numbers are numeric axes (log scaled over a decade or more);
   other values (a model's name, a schedule) are categories. Runs without the chosen metric are left out, and the page says how many.
   Names of keys, values and metrics reach plotly as text, never as its markup (static/plot_text.js).
   runs_compare.js calls draw() again after it has read the page anew. */
(function () {
  "use strict";
  var literal = window.TemperPlotText.literal;
  // The metric picked, kept while the page reads itself again and in the address (a shared link's pick).
  var chosen = new URLSearchParams(window.location.search).get("metric");

  // Ticked with the values of the runs drawn (``rows``): a run left out for want of the metric names none.
  function categoryAxis(axis, rows) {
    var categories = rows.map(function (row) { return axis.values[row]; })
      .filter(function (value, index, all) { return all.indexOf(value) === index; }).sort();
    return { label: literal(axis.key), values: rows.map(function (row) { return categories.indexOf(axis.values[row]); }),
      tickvals: categories.map(function (_, index) { return index; }), ticktext: categories.map(literal),
      range: [0, Math.max(categories.length - 1, 1)] };
  }

  // A numeric key swept over a decade or more (learning rates) is drawn on a log scale, which
  // parcoords lacks: the axis holds log10 of the values and is ticked with the values themselves.
  function numericAxis(axis, rows) {
    var values = rows.map(function (row) { return axis.values[row]; });
    var low = Math.min.apply(null, values), high = Math.max.apply(null, values);
    if (!(low > 0 && high / low >= 10)) return { label: literal(axis.key), values: values };
    var ticks = values.filter(function (value, index, all) { return all.indexOf(value) === index; })
      .sort(function (a, b) { return a - b; });
    return { label: literal(axis.key + " (log)"), values: values.map(Math.log10), tickvals: ticks.map(Math.log10),
      ticktext: ticks.map(String) };
  }

  function draw() {
    var source = document.getElementById("hyperparameters-data");
    var plot = document.getElementById("hyperparameters-plot");
    if (!source || !plot) return;
    var data = JSON.parse(source.textContent);
    var select = document.getElementById("hp-metric");
    if (chosen !== null && data.metrics[chosen]) select.value = chosen;
    if (!select.dataset.bound) {
      select.dataset.bound = "1";
      select.addEventListener("change", function () {
        chosen = select.value;
        window.TemperKeepInAddress("metric", chosen);
        draw();
      });
    }
    var metric = select.value, scores = data.metrics[metric];
    var rows = scores.map(function (_, index) { return index; }).filter(function (index) { return scores[index] !== null; });
    var dimensions = data.axes.map(function (axis) {
      return axis.numeric ? numericAxis(axis, rows) : categoryAxis(axis, rows);
    });
    var metricValues = rows.map(function (row) { return scores[row]; });
    dimensions.push({ label: literal(metric), values: metricValues });
    var missing = document.getElementById("hp-missing");
    var left = scores.length - rows.length;
    missing.hidden = left === 0;
    missing.textContent = !left ? "" : left + " of the " + scores.length + " runs " +
      (left === 1 ? "has no " + metric + " and is not drawn." : "have no " + metric + " and are not drawn.");
    var margin = { l: 60, r: 60, t: 48, b: 24 };
    // At a phone's width a dozen axes were 17 px apart, one smudge: the chart keeps them MIN_AXIS_SPACING apart and
    // scrolls sideways inside its card (.chart-scroll) when the card is narrower.
    plot.style.minWidth = (margin.l + margin.r + MIN_AXIS_SPACING * (dimensions.length - 1)) + "px";
    var tilt = labelTilt(dimensions, plot.clientWidth - margin.l - margin.r);
    margin.t += tilt.room;
    window.Plotly.react(plot, [{ type: "parcoords", dimensions: dimensions, labelangle: tilt.angle,
      line: { color: metricValues, colorscale: "Viridis", showscale: true, colorbar: { thickness: 12 } } }],
      { height: 340 + tilt.room, margin: margin, paper_bgcolor: "rgba(0,0,0,0)", font: { size: 11 } },
      { displayModeBar: false, responsive: true });
  }

  // Axis names are written level, centred over their axes; with a dozen keys at 1280 px, neighbours ran into
  // each other ("optim.learning_rate (log)" over "optim.warmup_steps"). When two would meet they are tilted,
  // which sets them apart by the axes' spacing times the sine of the tilt, and the chart gets the room above.
  var MIN_AXIS_SPACING = 72;    // pixels: tilted, neighbouring names are 36 px apart
  var LABEL_CHAR_PIXELS = 6.5;  // an 11 px sans-serif character, generously
  var TILT_DEGREES = 30;
  function labelTilt(dimensions, plotWidth) {
    var widths = dimensions.map(function (dimension) { return dimension.label.length * LABEL_CHAR_PIXELS; });
    var spacing = plotWidth / Math.max(dimensions.length - 1, 1), crowded = false;
    for (var index = 1; index < widths.length; index++) {
      if ((widths[index - 1] + widths[index]) / 2 + 8 > spacing) crowded = true;
    }
    if (!crowded) return { angle: 0, room: 0 };
    var longest = Math.max.apply(null, widths);
    return { angle: -TILT_DEGREES, room: Math.ceil(longest * Math.sin(TILT_DEGREES * Math.PI / 180)) };
  }

  window.TemperHyperparameters = { draw: draw };
  draw();
})();
