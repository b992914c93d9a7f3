/* The campaign page follows a load, a generation or an export by reading itself again every few seconds
   (a <noscript> refresh does it without scripts), but not while one of its confirmations (Delete…, Cancel
   the generation…) is open: a reload closed it under the owner's pointer every 3 seconds, so the button
   inside could hardly be pressed. */
(function () {
  "use strict";
  const seconds = Number(document.currentScript.dataset.seconds) || 3;

  function again() {
    if (document.querySelector("details.confirm[open]")) {
      setTimeout(again, seconds * 1000);
      return;
    }
    window.location.reload();
  }

  setTimeout(again, seconds * 1000);
})();
