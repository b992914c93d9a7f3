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
