/* Reward-function lists (templates/runs/_spec_field.html's rewards widget, on the launch page and the New
   evaluation page): add and remove rows; a row shows the arguments of its chosen function. */
(function () {
  "use strict";
  // Only the chosen function's argument inputs are shown; the server reads only those.
  function showArguments(row) {
    var chosen = row.querySelector("select.reward-function").value;
    row.querySelectorAll(".reward-args").forEach(function (group) { group.hidden = group.dataset.function !== chosen; });
  }

  function bindRow(row) {
    row.querySelector("select.reward-function").addEventListener("change", function () { showArguments(row); });
    row.querySelector("button.reward-remove").addEventListener("click", function () { row.remove(); });
  }

  document.querySelectorAll(".reward-list").forEach(function (list) {
    var rows = list.querySelector(".reward-rows");
    var template = list.querySelector("template.reward-row-template");
    rows.querySelectorAll(".reward-row").forEach(bindRow);
    list.querySelector("button.reward-add").addEventListener("click", function () {
      // Row numbers only keep inputs apart: the server reads rows in page order.
      var next = 0;
      rows.querySelectorAll(".reward-row").forEach(function (row) { next = Math.max(next, Number(row.dataset.index) + 1); });
      var holder = document.createElement("div");
      holder.innerHTML = template.innerHTML.split("__row__").join(String(next));
      var row = holder.firstElementChild;
      rows.appendChild(row);
      bindRow(row);
      showArguments(row);
      row.querySelector("select.reward-function").focus();
    });
  });
})();
