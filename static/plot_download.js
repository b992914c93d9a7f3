/* A chart of the run page or the compare page, downloaded as a picture. Plotly's own bar, whose camera does that, is
   hidden on these pages (its zoom and pan buttons repeat what the mouse does) and the plot is hidden from screen
   readers but its legend's entries (static/plot_legend.js), so each chart has a button of the page's own under it, named for its chart. The picture is the chart as
   shown (its zoom, the runs hidden from it) at its size, on a white background: the pages draw their charts on a
   transparent one, which an image viewer's dark background made unreadable. */
window.TemperPlotDownload = (function () {
  "use strict";

  // ``text`` as a part of a file's name: what is not a letter, a digit, '.', '_' or '-' (a metric's '/') is '_'.
  function fileNamePart(text) { return String(text).replace(/[^A-Za-z0-9._-]+/g, "_"); }

  return {
    // A button that downloads chart ``plot``, named ``name``, as <``prefix``>-<name>.png (``prefix``: the charts'
    // holder's data-download-name, the project's and the run's); ``beforeDownload`` (if given) draws it first when it
    // is not drawn yet.
    button: function (plot, name, prefix, beforeDownload) {
      var button = document.createElement("button");
      button.type = "button";
      button.className = "chart-download";
      button.textContent = "PNG";
      button.setAttribute("aria-label", "Download the " + name + " chart as PNG");
      button.title = "Download this chart as a PNG picture";
      button.addEventListener("click", function () {
        if (beforeDownload) beforeDownload();
        if (!plot.data) return;
        var size = { width: plot.clientWidth, height: plot.layout.height };
        var layout = Object.assign({}, plot.layout, size, { paper_bgcolor: "#ffffff", plot_bgcolor: "#ffffff" });
        window.Plotly.downloadImage({ data: plot.data, layout: layout }, Object.assign({
          format: "png", filename: fileNamePart(prefix) + "-" + fileNamePart(name) }, size));
      });
      return button;
    },
  };
})();
