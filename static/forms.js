/* A form marked data-submit-once is sent once per press: a double click on Launch sent it twice and
   queued two runs (two battles, two campaigns). Its submit buttons are disabled while the next page
   loads, and enabled again when the page is shown from the back/forward cache. */
(function () {
  "use strict";
  var forms = document.querySelectorAll("form[data-submit-once]");
  function buttons(form) { return form.querySelectorAll("button[type=submit], button:not([type])"); }
  forms.forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (form.dataset.sent) { event.preventDefault(); return; }
      form.dataset.sent = "1";
      // After this handler: the button's own name/value, if any, is already in the submission.
      setTimeout(function () { buttons(form).forEach(function (button) { button.disabled = true; }); }, 0);
    });
  });
  window.addEventListener("pageshow", function () {
    forms.forEach(function (form) {
      delete form.dataset.sent;
      buttons(form).forEach(function (button) { button.disabled = false; });
    });
  });
})();

/* A form's one-time token (webapp/core/submissions.py) is hidden, and Back to a page the browser
   fetches again brings a new one while the fields the user had filled in are restored: the same
   launch sent again would look new to the server. So the token a form was sent with is kept for
   the session, and put back when the page is reached by Back or Forward; the server then answers
   an unchanged form with what it made the first time, and a changed one as a new sending. */
(function () {
  "use strict";
  var FIELD = "submission_token";
  var navigation = window.performance && performance.getEntriesByType ? performance.getEntriesByType("navigation")[0] : null;
  var backOrForward = navigation && navigation.type === "back_forward";
  document.querySelectorAll("form").forEach(function (form, index) {
    var input = form.querySelector("input[name=" + FIELD + "]");
    if (!input) return;
    var key = "sent-token:" + location.pathname + location.search + ":" + (form.id || index);
    try {
      var sent = sessionStorage.getItem(key);
      if (backOrForward && sent) input.value = sent;
      form.addEventListener("submit", function () { sessionStorage.setItem(key, input.value); });
    } catch (error) { /* storage disabled: the token stays the page's own */ }
  });
})();

/* A page that comes back with a refused form puts the focus on its first refused field, whose
   aria-describedby reads out why (Django marks it aria-invalid): otherwise the focus starts at the
   top of the page and a keyboard or screen-reader user must hunt for what to fix. A page that
   placed the focus itself (an autofocus field, a summary box) keeps it. A page sent to a fragment
   (the run page's #edit-form) has the focus taken back to the page as it scrolls there: it is
   placed again once the page has loaded. */
(function () {
  "use strict";
  var refused = document.querySelector("main [aria-invalid=true]");
  if (!refused) return;
  function focusRefused() {
    if (document.activeElement && document.activeElement !== document.body) return;
    refused.focus();
  }
  focusRefused();
  if (window.location.hash) window.addEventListener("load", function () { window.setTimeout(focusRefused, 0); });
})();
