/* What a click in a chart's legend hides, on the run page (a group of a chart by group) and the compare page (a run,
   a group). Plotly's own click hid a line in that chart alone, and the page's next drawing (a live point, another x
   axis, the page read again) showed it again. Here a click hides what the entry stands for in every chart it is
   drawn in, kept across drawings, in the page's address (so that a copied link opens the same view) and counted on a
   "Show the N hidden …" button that shows them all again; a double click shows that one alone, and once more every one.
   The page keeps the charts: it asks ``has`` as it draws a line, and draws again when told.
   A legend entry is a toggle button for the keyboard and screen readers too (plotly's were for the mouse alone):
   Enter or Space does what a click does and Shift with either what a double click does, and it says whether its line
   is shown (aria-pressed). A legend is one Tab stop, a toolbar named for its chart (WAI-ARIA's toolbar pattern, a
   roving tabindex): each entry its own stop made a 16-run comparison 16 stops a chart. Tab enters it at the entry
   focused last, the arrows move between its entries, Home and End to its first and last. The rest of a plotly chart
   (ticks, titles, paths) reads as noise and stays hidden from screen readers (aria-hidden), which the page's caption
   or Final metrics table speak for. */
window.TemperPlotLegend = (function () {
  "use strict";

  var ENTRY = ".legend .traces";  // plotly's element of a legend entry

  // A legend entry is a target of at least TARGET pixels square (WCAG 2.2's target size, 2.5.8, as every other control
  // of the charts). Plotly's clickable box of an entry (its .legendtoggle) is its text's line: 19 pixels at the charts'
  // 10 pixel legend font, and entries stacked 19 pixels apart, each box against the next. Plotly sets legend entries
  // apart only between legend groups (tracegroupgap): each line is a legend group of its own (``group``), spaced
  // TARGET less those 19 pixels apart (LAYOUT), and describe makes each entry's box TARGET pixels tall about its
  // middle, so that the boxes meet and do not overlap.
  var TARGET = 24;
  var LAYOUT = { font: { size: 10 }, traceorder: "grouped", tracegroupgap: TARGET - 19 };

  // Entry ``entry``'s clickable box made TARGET pixels tall (plotly draws it anew at its own height each drawing).
  function sizeTarget(entry) {
    var box = entry.querySelector(".legendtoggle");
    if (!box || Number(box.getAttribute("height")) >= TARGET) return;
    box.setAttribute("y", String(-TARGET / 2));
    box.setAttribute("height", String(TARGET));
  }

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

  // plot element -> { index, inside }: the trace of the legend entry that takes the Tab stop (roving tabindex), and
  // whether the focus is in the legend, so that a drawing that makes its entries anew hands the focus on to them.
  var rovings = new WeakMap();

  function rovingOf(plot) {
    if (!rovings.has(plot)) rovings.set(plot, { index: null, inside: false });
    return rovings.get(plot);
  }

  // The entry of ``entries`` that takes the Tab stop: the one focused last, else the first.
  function stopOf(plot, entries) {
    var index = rovingOf(plot).index;
    return entries.filter(function (entry) { return traceOf(entry).index === index; })[0] || entries[0];
  }

  // Drawn chart ``plot``'s legend as a toolbar of toggle buttons ("Show <name>", pressed while its line is shown), one
  // Tab stop, and the rest of it hidden from screen readers, after each drawing: it may add entries and other
  // elements, and a line's shown or not changes.
  function describe(plot) {
    var legend = plot.querySelector(".legend");
    var entries = Array.prototype.slice.call(plot.querySelectorAll(ENTRY));
    if (!legend || !entries.length) { hideAllBut(plot, []); return; }
    var stop = stopOf(plot, entries);
    entries.forEach(function (entry) {
      entry.setAttribute("tabindex", entry === stop ? "0" : "-1");
      entry.setAttribute("role", "button");
      entry.setAttribute("aria-label", "Show " + entry.querySelector(".legendtext").textContent);
      entry.setAttribute("aria-pressed", String(traceOf(entry).visible === true));
      hideAllBut(entry, []);  // its text is its name already
      sizeTarget(entry);
    });
    hideAllBut(plot, [legend]);
    legend.removeAttribute("aria-hidden");
    legend.setAttribute("role", "toolbar");
    legend.setAttribute("aria-label", "Legend of " + plot.dataset.metric);
    hideAllBut(legend, entries);
    var focused = document.activeElement;
    if (rovingOf(plot).inside && (!focused || focused === document.body)) stop.focus({ preventScroll: true });
  }

  // The entry an arrow, Home or End (``key``) moves to from ``entry`` of ``entries``, or null for another key. The
  // arrows go round: from the last entry to the first.
  function movedTo(entries, entry, key) {
    var at = entries.indexOf(entry), last = entries.length - 1;
    var to = { ArrowRight: at + 1, ArrowDown: at + 1, ArrowLeft: at - 1, ArrowUp: at - 1, Home: 0, End: last }[key];
    if (to === undefined) return null;
    return entries[to > last ? 0 : to < 0 ? last : to];
  }

  // The keys of WAI-ARIA's toolbar in ``plot``'s legend, and the Tab stop kept on the entry focused last. A focus
  // that leaves the page's DOM with its entry (plotly drew the legend anew) is no reader's leaving: describe hands
  // it to the new entry.
  function rove(plot) {
    var roving = rovingOf(plot);
    plot.addEventListener("focusin", function (event) {
      var entry = event.target.closest(ENTRY);
      if (!entry) return;
      roving.index = traceOf(entry).index;
      roving.inside = true;
      plot.querySelectorAll(ENTRY).forEach(function (each) { each.setAttribute("tabindex", each === entry ? "0" : "-1"); });
    });
    plot.addEventListener("focusout", function (event) {
      var entry = event.target.closest(ENTRY);
      if (!entry || (event.relatedTarget && plot.contains(event.relatedTarget))) return;
      setTimeout(function () { if (entry.isConnected) roving.inside = false; }, 0);
    });
    plot.addEventListener("keydown", function (event) {
      if (event.altKey || event.ctrlKey || event.metaKey) return;  // the browser's own (Alt+Left: back)
      var entry = event.target.closest(ENTRY);
      var next = entry && movedTo(Array.prototype.slice.call(plot.querySelectorAll(ENTRY)), entry, event.key);
      if (!next) return;
      event.preventDefault();  // the arrows and Home and End would scroll the page
      next.focus({ preventScroll: true });
    });
  }

  return {
    // A chart's legend layout (plotly's layout.legend, to which a page adds where the legend lies): entries TARGET pixels
    // apart, each line a legend group of its own (``group``).
    layout: function (placed) { return Object.assign({}, LAYOUT, placed || {}); },
    // A trace's legendgroup that is its own in its chart (``key``: whatever names its line there), which sets its legend
    // entry apart from the others (LAYOUT's tracegroupgap). Plotly's groups are for the legend's layout alone here: a
    // click acts through ``follow``.
    group: function (key) { return "line " + key; },
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
    // Drawn chart ``plot`` (after its first drawing) read by a screen reader as its legend alone, a toolbar of toggle
    // buttons that is one Tab stop, after each drawing; ``act(curveNumber, alone)`` (if given) is called for the
    // entry of that trace in place of plotly's own click, ``alone`` for a double click or Shift with Enter or Space.
    // Plotly tells a double click's two clicks as clicks too, before the double click: a click acts once the double
    // click's wait is over, as plotly's own does, and a double click drops the click waiting (each acted at once, the
    // legend was drawn again between a double click's two clicks, which then missed it). Plotly keeps an entry's
    // element across drawings, so the focus stays on it as the line it toggles is hidden or shown.
    follow: function (plot, act) {
      plot.on("plotly_afterplot", function () { describe(plot); });
      describe(plot);
      rove(plot);
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
