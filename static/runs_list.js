/* The runs table follows its runs without a reload: its rows are read again from the same address
   (filters, sort and page kept) every 5 s while a run in it is queued or running, every 30 s otherwise
   (a run launched from another tab appears), and only while the page is shown. Ticked boxes stay ticked. */
(function () {
  "use strict";
  var table = document.querySelector(".runs-table");
  if (!table) return;
  var ACTIVE_MS = 5000, IDLE_MS = 30000;

  function anyActive(root) { return root.querySelector("tr[data-active='1']") !== null; }

  function refresh() {
    if (document.visibilityState !== "visible") return schedule();
    window.TemperPageAgain()
      .then(function (page) {
        var fresh = page && page.querySelector(".runs-table");
        if (!fresh) return;
        var ticked = new Set(Array.from(table.querySelectorAll("input[name=runs]:checked")).map(function (box) { return box.value; }));
        fresh.querySelectorAll("input[name=runs]").forEach(function (box) { box.checked = ticked.has(box.value); });
        // The head too: a column (Reward) comes with the first run that logs it.
        table.replaceChildren.apply(table, Array.from(document.importNode(fresh, true).childNodes));
      })
      .catch(function () {})  // asked again at the next tick
      .then(schedule);
  }

  function schedule() { setTimeout(refresh, anyActive(table) ? ACTIVE_MS : IDLE_MS); }

  schedule();
})();
