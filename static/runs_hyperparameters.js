/* The compare page's parallel-coordinates chart (webapp/runs/selectors.py: hyperparameter_axes): a
   line per run through the config keys that differ, ending on the run's last value of the chosen
   metric, which also colors the lines. Numbers are numeric axes (log scaled over a decade or more);
   other values (a model's name, a schedule) are categories. Runs without the chosen metric are left out, and the page says how many.
   Names of keys, values and metrics reach plotly as text, never as its markup (static/plot_text.js).
   It is drawn when it is scrolled near (drawWhenShown); runs_compare.js calls draw() again after it has read the
   page anew. */
(function () {
  "use strict";
  var literal = window.TemperPlotText.literal;
  // The metric picked, kept while the page reads itself again and in the address (a shared link's pick).
  var chosen = new URLSearchParams(window.location.search).get("metric");

  // Ticked with the values of the runs drawn (``rows``): a run left out for want of the metric names none.
  // ``categories`` keeps the values whole: the ticks are shortened to the room the axes leave (shortenTicks).
  // Unlike a label, a parcoords tick is written as plain text (d3's axis), never read as markup: it takes the
  // value as it is (through literal() it showed "&lt;b&gt;").
  function categoryAxis(axis, rows) {
    var categories = rows.map(function (row) { return axis.values[row]; })
      .filter(function (value, index, all) { return all.indexOf(value) === index; }).sort();
    return { label: literal(axis.key), values: rows.map(function (row) { return categories.indexOf(axis.values[row]); }),
      tickvals: categories.map(function (_, index) { return index; }), ticktext: categories.slice(),
      range: [0, Math.max(categories.length - 1, 1)], categories: categories };
  }

  // A category axis writes its values to its left, where the axis before it stands: a model's or a dataset's long
  // name ran over that axis and its values (and the first axis's out of the chart). Each value too wide for the
  // room is cut in its middle, where a sweep's names are alike, and the whole value is the tick's hover text.
  var TICK_FONT = '11px "Open Sans", verdana, arial, sans-serif';  // plotly's font at the chart's size
  var TICK_GAP = 16;  // pixels: the tick mark and a little air before the axis to the left
  var measure = document.createElement("canvas").getContext("2d");
  measure.font = TICK_FONT;
  function textWidth(text) { return measure.measureText(text).width; }

  // ``text`` cut to ``room`` pixels around an ellipsis, ``headShare`` of the characters kept from its start.
  function shortened(text, room, headShare) {
    var letters = Array.from(text);  // whole characters, never half a surrogate pair
    if (textWidth(text) <= room) return text;
    var cut = function (count) {
      var head = Math.round(count * headShare);
      return letters.slice(0, head).join("") + "…" + letters.slice(letters.length - (count - head)).join("");
    };
    var keep = letters.length - 1;
    while (keep > 1 && textWidth(cut(keep)) > room) keep -= 1;
    return cut(keep);
  }

  // The widest whole value of any category axis, in pixels.
  function widestTick(dimensions) {
    return Math.max.apply(null, [0].concat(dimensions.map(function (dimension) {
      return Math.max.apply(null, [0].concat((dimension.categories || []).map(textWidth)));
    })));
  }

  // Shortens each category axis's ticks to ``room`` pixels, cut in the middle or, where that leaves two values
  // alike, nearer their start: values cut to the same text would be one tick standing for both, so an axis whose
  // values differ only where every cut falls keeps them whole.
  function shortenTicks(dimensions, room) {
    dimensions.forEach(function (dimension) {
      if (!dimension.categories) return;
      var distinct = function (ticks) { return ticks.every(function (tick, index) { return ticks.indexOf(tick) === index; }); };
      dimension.ticktext = [0.5, 0.25, 0].map(function (headShare) {
        return dimension.categories.map(function (category) { return shortened(category, room, headShare); });
      }).filter(distinct)[0] || dimension.categories.slice();
    });
  }

  // Each category tick's whole value as an SVG <title> (the browser shows it on hover), the tick taking the pointer:
  // plotly's overlay of the axes lets it through to the lines' canvas below. Plotly draws the axes anew on every
  // drawing, so this runs after each.
  function titleTicks(plot, dimensions) {
    plot.querySelectorAll(".y-axis").forEach(function (axis) {
      var dimension = axis.__data__ && dimensions[axis.__data__.visibleIndex];
      if (!dimension || !dimension.categories) return;
      axis.querySelectorAll(".tick text").forEach(function (text) {
        var index = dimension.ticktext.indexOf(text.__data__);
        if (index < 0 || text.querySelector("title")) return;
        var title = document.createElementNS("http://www.w3.org/2000/svg", "title");
        title.textContent = dimension.categories[index];
        text.appendChild(title);
        text.style.pointerEvents = "auto";
      });
    });
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
    var spans = Math.max(dimensions.length - 1, 1);
    var fit = function () {
      plot.style.minWidth = (margin.l + margin.r + MIN_AXIS_SPACING * (dimensions.length - 1)) + "px";
      return (plot.clientWidth - margin.l - margin.r) / spans;
    };
    // The first axis's values are written in the left margin: it widens to hold them, up to the room the other
    // axes' values get between two axes, which that widening narrows in turn (twice settles it).
    var widest = widestTick(dimensions);
    for (var pass = 0; pass < 2; pass++) margin.l = Math.max(60, Math.ceil(Math.min(widest, fit() - TICK_GAP) + TICK_GAP));
    var spacing = fit();
    shortenTicks(dimensions, Math.min(spacing, margin.l) - TICK_GAP);
    var tilt = labelTilt(dimensions, spacing * spans);
    margin.t += tilt.room;
    window.Plotly.react(plot, [{ type: "parcoords", dimensions: dimensions, labelangle: tilt.angle,
      line: { color: metricValues, colorscale: "Viridis", showscale: true, colorbar: { thickness: 12 } } }],
      { height: 340 + tilt.room, margin: margin, paper_bgcolor: "rgba(0,0,0,0)", font: { size: 11 } },
      { displayModeBar: false, responsive: true }).then(function () { titleTicks(plot, dimensions); });
    if (!plot.dataset.titled) {
      plot.dataset.titled = "1";
      plot.on("plotly_afterplot", function () { titleTicks(plot, current); });
    }
    current = dimensions;
  }
  var current = [];  // the dimensions drawn last, for the titles of a drawing plotly makes itself (a resize)

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

  // Plotly draws parallel coordinates through WebGL and waits on the GPU after every pair of axes: without one (software
  // WebGL, a loaded machine) that held the main thread 1-2 s, at every load and every reading again of the page, for a
  // chart below the metric charts and the final metrics, out of the window. So it is drawn when it comes within
  // SHOWN_MARGIN of the window (at once where the browser cannot tell), as the reader scrolls to it; a chart in the
  // window at the start is drawn then.
  var SHOWN_MARGIN = "200px 0px";
  var watching = null;  // the IntersectionObserver waiting for the chart now on the page, if any
  function drawWhenShown() {
    if (watching) watching.disconnect();  // a chart the page read anew replaced
    watching = null;
    var plot = document.getElementById("hyperparameters-plot");
    if (!plot) return;
    if (!("IntersectionObserver" in window)) return draw();
    var observer = watching = new IntersectionObserver(function (entries) {
      if (!entries.some(function (entry) { return entry.isIntersecting; })) return;
      observer.disconnect();
      if (watching === observer) watching = null;
      draw();
    }, { rootMargin: SHOWN_MARGIN });
    observer.observe(plot);
  }

  // runs_compare.js draws the chart again (or waits for it to be shown) after it has read the page anew.
  window.TemperHyperparameters = { draw: drawWhenShown };
  // Never before the page has shown the metric charts above it (runs_compare.js draws them as it loads): a frame, then
  // a task after it.
  window.requestAnimationFrame(function () { setTimeout(drawWhenShown, 0); });
})();
