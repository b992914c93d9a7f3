/* The run page's evaluations across checkpoints: one line per figure (version, metric, rows, reward functions) of the
   run's models' evaluations against their steps (evals.selectors.evaluation_curves, read from json_script), each point
   labelled with its value, the best a star. Steps and values are written as the run's own charts write them
   (TemperPlotAxis). The version's name and the models' labels are people's text: they go through
   TemperPlotText.literal before plotly reads them (it reads a few tags in names and hover text). */
(function () {
  "use strict";
  var element = document.getElementById("evaluation-curves");
  if (!element || !window.Plotly) return;
  var source = document.getElementById(element.dataset.chartSource);
  if (!source) return;
  var curves = JSON.parse(source.textContent);
  var literal = window.TemperPlotText.literal;
  var axis = window.TemperPlotAxis;
  var COLORS = ["#6366f1", "#f59e0b", "#10b981", "#ef4444", "#0ea5e9", "#a855f7"];

  var traces = curves.map(function (curve, index) {
    var points = curve.points;
    return {
      type: "scatter", mode: "lines+markers+text", name: literal(curve.name), cliponaxis: false,
      x: points.map(function (point) { return point.step; }),
      y: points.map(function (point) { return point.value; }),
      // Plotly sets a point's label off by its marker's size: the larger star keeps its label clear.
      text: points.map(function (point) { return axis.formatValue(point.value); }),
      textposition: "top center", textfont: { size: 10 },
      marker: { color: COLORS[index % COLORS.length],
                symbol: points.map(function (point) { return point.best ? "star" : "circle"; }),
                size: points.map(function (point) { return point.best ? 15 : 7; }) },
      line: { color: COLORS[index % COLORS.length] },
      hovertext: points.map(function (point) {
        return literal(point.model) + "<br>step " + point.step + ": " + axis.formatValue(point.value)
          + (point.best ? " (best)" : "");
      }),
      hoverinfo: "text",
    };
  });
  var layout = {
    height: 300, margin: { l: 56, r: 24, t: 24, b: 40 },
    xaxis: Object.assign(axis.xAxis("step", traces, element), { zeroline: false }),
    yaxis: { zeroline: false, automargin: true },
    showlegend: true, legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { size: 11 },
  };
  layout.margin.t = 24 + 20 * curves.length;  // the legend above, a line per curve at most
  window.Plotly.newPlot(element, traces, layout, axis.PLOT_CONFIG);
})();
