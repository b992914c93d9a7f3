/* What a click in a chart's legend hides, on the run page (a group of a chart by group) and the compare page (a run,
   a group). Plotly's own click hid a line in that chart alone, and the page's next drawing (a live point, another x
   axis, the page read again) showed it again. Here a click hides what the entry stands for in every chart it is
   drawn in, kept across drawings, in the page's address (so that a copied link opens the same view) and counted on a
   "Show the N hidden …" button that shows them all again; a double click shows that one alone, and once more every one.
   The page keeps the charts: it asks ``has`` as it draws a line, and draws again when told.
   A legend entry is a toggle button for the keyboard and screen readers too (plotly's were for the mouse alone): it
   takes the focus (Tab), Enter or Space does what a click does and Shift with either what a double click does, and
   it says whether its line is shown (aria-pressed). The rest of a plotly chart (ticks, titles, paths) reads as noise
   and stays hidden from screen readers (aria-hidden), which the page's caption or Final metrics table speak for. */
window.TemperPlotLegend = (function () {
  "use strict";

  var ENTRY = ".legend .traces";  // plotly's element of a legend entry

  // The trace (plotly's full one) of legend entry ``entry``: plotly binds its data to the element (d3's __data__).
  function traceOf(entry) { return entry.__data__[0].trace; }

  // Every element under ``element`` hidden from screen readers but ``kept`` and those holding them, which are no
  // more than holders (role none: an SVG read as an unnamed image).
  function hideAllBut(element, kept) {
    Array.prototype.forEach.call(element.children, function (child) {
      if (kept.indexOf(child) >= 0) return;
      var holds = kept.some(function (each) { return child.contains(each); });
      if (!holds) { child.setAttribute("aria-hidden", "true"); return; }
      child.removeAttribute("aria-hidden");
      child.setAttribute("role", "none");
      hideAllBut(child, kept);
    });
  }

  // Drawn chart ``plot``'s legend entries as toggle buttons ("Show <name>", pressed while its line is shown), and the
  // rest of it hidden from screen readers, after each drawing: it may add entries and other elements, and a line's shown
  // or not changes.
  function describe(plot) {
    var entries = Array.prototype.slice.call(plot.querySelectorAll(ENTRY));
    entries.forEach(function (entry) {
      entry.setAttribute("tabindex", "0");
      entry.setAttribute("role", "button");
      entry.setAttribute("aria-label", "Show " + entry.querySelector(".legendtext").textContent);
      entry.setAttribute("aria-pressed", String(traceOf(entry).visible === true));
      hideAllBut(entry, []);  // its text is its name already
    });
    hideAllBut(plot, entries);
  }

  return {
    // The keys (a run's id, a group's label: neither holds a comma) hidden from every chart of a kind: kept in the
    // address as ``parameter`` (comma-separated), counted on ``button`` as "Show the N hidden <noun>s", which shows
    // them all and hands the focus to the charts' ``holder`` (hidden, the button dropped it to the page's start, and a
    // keyboard user had to Tab back past the whole page); ``redraw`` draws the charts again after each change. ``restore(known)`` reads the address once, keeping
    // only the keys of ``known`` (a value no chart draws is left out, as every other setting of the address is).
    hiddenKeys: function (options) {
      var hidden = new Set();
      function show() {
        var count = hidden.size;
        options.button.hidden = count === 0;
        options.button.textContent = "Show the " + count + " hidden " + options.noun + (count === 1 ? "" : "s");
        window.TemperKeepInAddress(options.parameter, count ? Array.from(hidden).join(",") : null);
      }
      function changed() { show(); options.redraw(); }
      options.button.addEventListener("click", function () {
        var focused = document.activeElement === options.button;
        hidden.clear();
        changed();
        if (!focused) return;
        options.holder.tabIndex = -1;
        options.holder.focus({ preventScroll: true });
      });
      return {
        has: function (key) { return hidden.has(key); },
        restore: function (known) {
          (new URLSearchParams(window.location.search).get(options.parameter) || "").split(",").forEach(function (key) {
            if (known.indexOf(key) >= 0) hidden.add(key);
          });
          show();
        },
        toggle: function (key) {
          if (hidden.has(key)) hidden.delete(key); else hidden.add(key);
          changed();
        },
        // ``key`` alone shown of ``all``; when it already is, every one.
        showAlone: function (key, all) {
          var others = all.filter(function (each) { return each !== key; });
          var alone = !hidden.has(key) && others.every(function (each) { return hidden.has(each); });
          hidden.clear();
          if (!alone) others.forEach(function (each) { hidden.add(each); });
          changed();
        },
      };
    },
    // Drawn chart ``plot`` (after its first drawing) read by a screen reader as its legend's entries alone, each a
    // toggle button in the Tab order, after each drawing; ``act(curveNumber, alone)`` (if given) is called for the
    // entry of that trace in place of plotly's own click, ``alone`` for a double click or Shift with Enter or Space.
    // Plotly tells a double click's two clicks as clicks too, before the double click: a click acts once the double
    // click's wait is over, as plotly's own does, and a double click drops the click waiting (each acted at once, the
    // legend was drawn again between a double click's two clicks, which then missed it). Plotly keeps an entry's
    // element across drawings, so the focus stays on it as the line it toggles is hidden or shown.
    follow: function (plot, act) {
      plot.on("plotly_afterplot", function () { describe(plot); });
      describe(plot);
      if (!act) return;
      var waitingClick = null;
      plot.on("plotly_legendclick", function (event) {
        clearTimeout(waitingClick);
        waitingClick = setTimeout(function () { act(event.curveNumber, false); }, plot._context.doubleClickDelay);
        return false;
      });
      plot.on("plotly_legenddoubleclick", function (event) {
        clearTimeout(waitingClick);
        act(event.curveNumber, true);
        return false;
      });
      plot.addEventListener("keydown", function (event) {
        var entry = event.target.closest(ENTRY);
        if (!entry || (event.key !== "Enter" && event.key !== " ")) return;
        event.preventDefault();  // Space would scroll the page
        if (!event.repeat) act(traceOf(entry).index, event.shiftKey);
      });
    },
  };
})();
