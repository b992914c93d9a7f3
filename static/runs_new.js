/* The launch page: switch between the schema-built form and the YAML editor of the same spec. */
(function () {
  "use strict";
  var tabs = document.querySelectorAll("nav.tabs.small a[data-mode]");
  function show(mode) {
    document.querySelectorAll("form.launch-form").forEach(function (form) { form.hidden = form.dataset.mode !== mode; });
    tabs.forEach(function (tab) { tab.classList.toggle("active", tab.dataset.mode === mode); });
  }
  tabs.forEach(function (tab) {
    tab.addEventListener("click", function (event) { event.preventDefault(); show(tab.dataset.mode); });
  });
  if (window.location.hash === "#yaml") show("yaml");
})();
