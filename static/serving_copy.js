/* A serving copy is written by a serve worker, in seconds to minutes: while an element with
   data-follow-url shows a copy being written (data-copy-state="writing"), its partial is asked for
   again, less and less often, until the copy is ready or failed. Other work a worker does in the
   background is followed the same way while its partial marks it data-in-progress (the Storage
   page's prune). */
(function () {
  "use strict";

  function follow(element, delay) {
    if (!element.querySelector('[data-copy-state="writing"], [data-in-progress]')) return;
    window.setTimeout(function () {
      fetch(element.dataset.followUrl, { credentials: "same-origin" })
        .then(function (response) {
          if (!response.ok) throw new Error("serving copy: HTTP " + response.status);
          return response.text();
        })
        .then(function (html) {
          element.innerHTML = html;  // a server-rendered partial, escaped by Django
        })
        .catch(function () {})  // a failed request is asked again
        .then(function () { follow(element, Math.min(delay * 1.5, 30000)); });
    }, delay);
  }

  document.querySelectorAll("[data-follow-url]").forEach(function (element) {
    follow(element, window.TemperCopyPollMs || 2000);  // a test shortens it
  });
})();
