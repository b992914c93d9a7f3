/* Pages that follow what they show by reading their own address again (the runs table, the compare
   page): the page as it is now, parsed, or null when the server did not answer it. */
window.TemperPageAgain = function () {
  "use strict";
  return fetch(window.location.href, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
    .then(function (response) { return response.ok ? response.text() : null; })
    .then(function (html) { return html === null ? null : new DOMParser().parseFromString(html, "text/html"); });
};

/* A view's setting (the compare page's x axis, say) kept in the page's address as it changes, so that
   the link copied from the address bar opens the same view; null takes it out. The history gets no
   entry per change: Back still leaves the page. An address left with no setting has no "?" either (the run
   page, which keeps its hidden groups from its load on, was at ".../run_…/?"). */
window.TemperKeepInAddress = function (key, value) {
  "use strict";
  var params = new URLSearchParams(window.location.search);
  if (value === null) params.delete(key); else params.set(key, value);
  var query = params.toString();
  window.history.replaceState(window.history.state, "", (query ? "?" + query : window.location.pathname) +
                              window.location.hash);
};
