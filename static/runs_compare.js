/* The compare page: one overlaid chart per metric (a trace per run), x by step, tokens or wall
   time, EMA smoothing, log scale; and the "differences only" switch of the config table. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("compare-data").textContent);
  var holder = document.getElementById("compare-charts");
  var colors = ["#4f46e5", "#db2777", "#059669", "#d97706", "#0891b2", "#7c3aed", "#dc2626", "#65a30d", "#475569", "#c026d3"];
  var xAxis = document.getElementById("x-axis"), ema = document.getElementById("ema"), logY = document.getElementById("log-y");

  // Debiased exponential moving average (as TensorBoard draws it): weight in [0, 1).
  function smooth(values, weight) {
    if (!weight) return values;
    var out = [], last = 0, debias = 0;
    for (var i = 0; i < values.length; i++) {
      last = last * weight + (1 - weight) * values[i];
      debias = debias * weight + (1 - weight);
      out.push(last / debias);
    }
    return out;
  }

  function draw() {
    var axis = xAxis.value, weight = Number(ema.value);
    document.getElementById("ema-value").textContent = weight.toFixed(2);
    data.names.forEach(function (name, index) {
      var plot = holder.querySelector('[data-metric="' + CSS.escape(name) + '"]');
      if (!plot) {
        var figure = document.createElement("figure");
        figure.className = "chart";
        plot = document.createElement("div");
        plot.className = "plot";
        plot.dataset.metric = name;
        figure.appendChild(plot);
        holder.appendChild(figure);
      }
      var traces = data.runs.map(function (run, runIndex) {
        var entry = data.series[run.id][name];
        if (!entry) return null;
        return { x: entry[axis], y: smooth(entry.value, weight), name: run.name, type: "scatter", mode: "lines",
                 line: { color: colors[runIndex % colors.length], width: 1.5 } };
      }).filter(Boolean);
      window.Plotly.react(plot, traces, {
        height: 260, margin: { l: 56, r: 12, t: 28, b: 36 }, title: { text: name, font: { size: 13 } },
        xaxis: { title: { text: axis === "time" ? "seconds" : axis } }, yaxis: { type: logY.checked ? "log" : "linear" },
        legend: { orientation: "h", y: -0.25 }, showlegend: index === 0,
        paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { size: 11 },
      }, { displayModeBar: false, responsive: true });
    });
  }

  [xAxis, ema, logY].forEach(function (control) { control.addEventListener("input", draw); });
  document.getElementById("differences-only").addEventListener("change", function (event) {
    document.getElementById("diff-table").classList.toggle("only-differences", event.target.checked);
  });
  draw();
})();
