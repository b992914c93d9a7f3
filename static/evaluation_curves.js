/* The run page's evaluations across checkpoints: one line per figure (version, metric, rows, reward functions) of the
   run's models' evaluations against their steps (evals.selectors.evaluation_curves, read from json_script), each point
   labelled with its value, the best starred. The version's name and the models' labels are people's text: they go
   through TemperPlotText.literal before plotly reads them (it reads a few tags in names and hover text). */
(function () {
  "use strict";
  var element = document.getElementById("evaluation-curves");
  if (!element || !window.Plotly) return;
  var source = document.getElementById(element.dataset.chartSource);
  if (!source) return;
  var curves = JSON.parse(source.textContent);
  var literal = window.TemperPlotText.literal;
  var COLORS = ["#6366f1", "#f59e0b", "#10b981", "#ef4444", "#0ea5e9", "#a855f7"];

  function shown(value) { return Number(value.toPrecision(4)).toString(); }

  var traces = [];
  curves.forEach(function (curve, index) {
    var color = COLORS[index % COLORS.length];
    var name = literal(curve.name);
    var hover = curve.points.map(function (point) {
      return literal(point.model) + "<br>step " + point.step + ": " + shown(point.value) + (point.best ? " (best)" : "");
    });
    traces.push({
      type: "scatter", mode: "lines+markers+text", name: name, legendgroup: "curve" + index,
      x: curve.points.map(function (point) { return point.step; }),
      y: curve.points.map(function (point) { return point.value; }),
      text: curve.points.map(function (point) { return shown(point.value); }),
      textposition: "top center", textfont: { size: 10 }, marker: { size: 7, color: color }, line: { color: color },
      hovertext: hover, hoverinfo: "text",
    });
    var best = curve.points.filter(function (point) { return point.best; });
    traces.push({
      type: "scatter", mode: "markers", name: name + " (best)", legendgroup: "curve" + index, showlegend: false,
      x: best.map(function (point) { return point.step; }), y: best.map(function (point) { return point.value; }),
      marker: { symbol: "star", size: 16, color: color, line: { color: "#111827", width: 1 } },
      hovertext: best.map(function (point) { return literal(point.model) + "<br>best: " + shown(point.value); }),
      hoverinfo: "text",
    });
  });
  var layout = {
    height: 280, margin: { l: 56, r: 16, t: 16, b: 40 },
    xaxis: { title: { text: "step" }, zeroline: false }, yaxis: { zeroline: false },
    showlegend: true, legend: { orientation: "h", y: -0.25 },
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { size: 11 },
  };
  window.Plotly.newPlot(element, traces, layout, { displayModeBar: false, responsive: true });
})();
