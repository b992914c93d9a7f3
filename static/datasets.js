/* Dataset pages: length histograms (plotly, served from our static files), the column-mapping
   fields of the chosen kind, and a size check before a too-large upload is sent, then its progress (the base
   models' upload page uses these two). Each upload form says what to do past the limit, data-too-large, and the
   base models' what the server does once the bytes are in, data-after-upload. */
(function () {
  "use strict";

  function drawCharts() {
    if (!window.Plotly) return;
    document.querySelectorAll(".plot[data-chart-source]").forEach(function (element) {
      var source = document.getElementById(element.dataset.chartSource);
      if (!source) return;
      var chart = JSON.parse(source.textContent)[Number(element.dataset.chartIndex)];
      // Bins of one value sit on their value; wider bins span [start, start + width).
      var offset = chart.width === 1 ? 0 : chart.width / 2;
      var trace = {
        type: "bar",
        x: chart.x.map(function (start) { return start + offset; }),
        y: chart.y,
        width: chart.width === 1 ? 0.9 : chart.width,
        marker: { color: "#6366f1" },
        hovertemplate: "%{customdata}: %{y} rows<extra></extra>",
        customdata: chart.x.map(function (start) {
          return (chart.width === 1 ? start : start + "–" + (start + chart.width - 1)) + " " + chart.unit;
        }),
      };
      var highest = Math.max.apply(null, chart.y);
      var layout = {
        height: 220,
        margin: { l: 48, r: 12, t: 8, b: 40 },
        bargap: 0.04,
        // Lengths and counts are whole numbers: never put a tick between two of them.
        xaxis: { title: { text: chart.unit }, zeroline: false, dtick: chart.x.length < 8 ? chart.width : null },
        yaxis: { title: { text: "rows" }, rangemode: "tozero", dtick: highest < 6 ? 1 : null },
        paper_bgcolor: "rgba(0,0,0,0)",
        plot_bgcolor: "rgba(0,0,0,0)",
        font: { size: 11 },
      };
      window.Plotly.newPlot(element, [trace], layout, { displayModeBar: false, responsive: true });
    });
  }

  function showMappingFor(form) {
    var fieldset = form.querySelector("fieldset.mapping");
    if (!fieldset) return;
    var kindSelect = form.querySelector("select[name=kind]");
    var kind = kindSelect ? kindSelect.value : fieldset.dataset.kind;
    fieldset.querySelectorAll(".mapping-field").forEach(function (field) {
      field.hidden = field.dataset.kinds.split(" ").indexOf(kind) < 0;
    });
  }

  function humanBytes(size) {
    var units = ["bytes", "KB", "MB", "GB"];
    var unit = 0;
    while (size >= 1024 && unit < units.length - 1) { size /= 1024; unit += 1; }
    return (unit === 0 ? size : size.toFixed(1)) + " " + units[unit];
  }

  // Sends the form with XMLHttpRequest to show upload progress, then shows the page the server
  // answered with (the version page after its redirect, or the form with its errors).
  function sendWithProgress(form) {
    var progress = form.querySelector("progress.upload-progress");
    var label = form.querySelector(".upload-progress-label");
    var button = form.querySelector("button[type=submit]");
    var request = new XMLHttpRequest();
    request.open("POST", form.action);
    request.upload.addEventListener("progress", function (event) {
      if (!event.lengthComputable) return;
      progress.value = event.loaded / event.total;
      label.textContent = event.loaded === event.total && form.dataset.afterUpload
        ? "Uploaded " + humanBytes(event.total) + "; " + form.dataset.afterUpload
        : "Uploading: " + humanBytes(event.loaded) + " of " + humanBytes(event.total);
    });
    request.addEventListener("load", function () {
      history.replaceState(null, "", request.responseURL);
      document.open();
      document.write(request.responseText);
      document.close();
    });
    request.addEventListener("error", function () {
      label.textContent = "The upload failed (connection lost); try again.";
      button.disabled = false;
    });
    progress.hidden = false;
    label.hidden = false;
    button.disabled = true;
    request.send(new FormData(form));
  }

  function handleSubmit(form) {
    var input = form.querySelector("input[type=file]");
    var message = form.querySelector(".client-error");
    var limit = Number(form.dataset.maxBytes);
    form.addEventListener("submit", function (event) {
      var file = input && input.files && input.files[0];
      if (file && limit && file.size > limit) {
        event.preventDefault();
        message.textContent = file.name + " is " + humanBytes(file.size) + ", over the upload limit of " +
          humanBytes(limit) + "; " + form.dataset.tooLarge;
        message.hidden = false;
        // Read out from the field, which takes the focus: otherwise nothing seemed to happen to a screen reader.
        var described = (input.getAttribute("aria-describedby") || "").split(" ").filter(Boolean);
        if (described.indexOf(message.id) < 0) input.setAttribute("aria-describedby", described.concat(message.id).join(" "));
        input.setAttribute("aria-invalid", "true");
        input.focus();
        return;
      }
      message.hidden = true;
      if (file && window.FormData && window.XMLHttpRequest) {
        event.preventDefault();
        sendWithProgress(form);
      }
    });
  }

  // A new dataset's name from its file's (arith_train.jsonl: "arith train"), as long as the name is blank or still
  // the one filled in from an earlier file: a name typed is never replaced.
  function nameAfterFile(form) {
    var name = form.querySelector("input[name=name]");
    var file = form.querySelector("input[type=file]");
    if (!name || !file) return;
    var filled = "";
    file.addEventListener("change", function () {
      var chosen = file.files && file.files[0];
      if (!chosen || (name.value !== "" && name.value !== filled)) return;
      var stem = chosen.name.replace(/(\.(jsonl|json|csv|parquet|gz|zst))+$/i, "").replace(/_+/g, " ").trim();
      filled = stem.slice(0, Number(name.getAttribute("maxlength")) || stem.length);
      name.value = filled;
    });
  }

  document.querySelectorAll("form.upload-form").forEach(function (form) {
    showMappingFor(form);
    nameAfterFile(form);
    var kindSelect = form.querySelector("select[name=kind]");
    if (kindSelect) kindSelect.addEventListener("change", function () { showMappingFor(form); });
    handleSubmit(form);
  });
  drawCharts();
})();
