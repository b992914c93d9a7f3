/* Pages that follow what they show by reading their own address again (the runs table, the compare
   page): the page as it is now, parsed, or null when the server did not answer it. */
window.TemperPageAgain = function () {
  "use strict";
  return fetch(window.location.href, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
    .then(function (response) { return response.ok ? response.text() : null; })
    .then(function (html) { return html === null ? null : new DOMParser().parseFromString(html, "text/html"); });
};
