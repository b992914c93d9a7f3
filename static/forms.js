/* A form marked data-submit-once is sent once per press: a double click on Launch sent it twice and
   queued two runs (two battles, two campaigns). Its submit buttons are disabled while the next page
   loads, and enabled again when the page is shown from the back/forward cache. Listened to on the
   document, not on each form: a partial put in anew in place (the run page's checkpoints, with their
   export forms) brings forms that were not on the page when this ran. */
(function () {
  "use strict";
  function buttons(form) { return form.querySelectorAll("button[type=submit], button:not([type])"); }
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-submit-once")) return;
    if (form.dataset.sent) { event.preventDefault(); return; }
    form.dataset.sent = "1";
    // After this handler: the button's own name/value, if any, is already in the submission.
    setTimeout(function () { buttons(form).forEach(function (button) { button.disabled = true; }); }, 0);
  });
  window.addEventListener("pageshow", function () {
    document.querySelectorAll("form[data-submit-once]").forEach(function (form) {
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

/* Messages shown after a redirect ("Run queued", "Deleted the run ...") are in the page as it loads, and a
   screen reader announces neither a live region's content present at load nor text away from the focus: they
   went unheard. So, as the GOV.UK design system does with its notification banner, the focus moves to them and
   they are read; they are no tab stop (tabindex is taken off as the focus leaves), so Tab goes on into the page
   after them. A page that places the focus itself (a refused field, an autofocus field, a script of its own, a
   fragment it was sent to) keeps it: the messages are then said in #messages-said, a live region empty at load,
   once the page has loaded. This runs after the page's own scripts (DOMContentLoaded), to see where they put it. */
(function () {
  "use strict";
  var box = document.getElementById("messages");
  var said = document.getElementById("messages-said");
  if (!box || !said) return;
  // The time a screen reader takes to find the live region in the new page before its text changes.
  var ANNOUNCE_AFTER_MS = 250;
  document.addEventListener("DOMContentLoaded", function () {
    var placed = (document.activeElement && document.activeElement !== document.body) ||
      document.querySelector("[autofocus]") || window.location.hash;
    if (!placed) {
      box.setAttribute("tabindex", "-1");
      box.addEventListener("blur", function () { box.removeAttribute("tabindex"); }, { once: true });
      box.focus();
      return;
    }
    var text = Array.prototype.map.call(box.querySelectorAll(".message"), function (message) {
      return message.textContent.trim();
    }).join(" ");
    window.setTimeout(function () { said.textContent = text; }, ANNOUNCE_AFTER_MS);
  });
})();

/* The low-disk banner (base.html) is on the page as it loads, where a screen reader announces neither a live
   region's content nor text away from the focus, and taking the focus for it would take it from the page's own
   (a message, a refused field). So its words are said in #disk-low-said, a live region empty at load, once the
   page has loaded; once a browsing session for the same disks, not on every page visited while they stay low
   (it stays on each page, the first thing in it, for whoever reads the page through). */
(function () {
  "use strict";
  var banner = document.getElementById("disk-low");
  var said = document.getElementById("disk-low-said");
  if (!banner || !said) return;
  var ANNOUNCE_AFTER_MS = 250;  // as the messages': the time a screen reader takes to find the live region
  var KEY = "disk-low-said";
  var disks = Array.prototype.map.call(banner.querySelectorAll("code"), function (code) {
    return code.textContent;
  }).join(" ");
  try {
    if (sessionStorage.getItem(KEY) === disks) return;
    sessionStorage.setItem(KEY, disks);
  } catch (error) { /* storage disabled: said on every page */ }
  document.addEventListener("DOMContentLoaded", function () {
    window.setTimeout(function () { said.textContent = banner.textContent.replace(/\s+/g, " ").trim(); },
      ANNOUNCE_AFTER_MS);
  });
})();

/* The new conversation's Thinking switch (webapp/chat/forms.py ConversationForm) is there only for the models
   whose chat template reads enable_thinking, as the server found and lists in data-thinking-defaults (each with
   its default): shown and set to that default as the model select changes, hidden for the other models. */
(function () {
  "use strict";
  var box = document.querySelector("input[data-thinking-defaults]");
  var select = box && box.form ? box.form.querySelector("select[name=model]") : null;
  if (!select) return;
  var defaults = JSON.parse(box.dataset.thinkingDefaults);
  var field = box.closest(".field");
  select.addEventListener("change", function () {
    var reads = Object.prototype.hasOwnProperty.call(defaults, select.value);
    field.hidden = !reads;
    if (reads) box.checked = defaults[select.value];
  });
})();

/* Chat template variables (webapp/chat/forms.py ConversationForm._add_variables, the arena's compare mode:
   arena_views._compare_variables): each field lists in data-template-variable the models whose template reads it,
   with each one's own value. As the model select (the arena: model A's and B's) changes, a field is shown and enabled
   where a picked model reads it, else hidden and disabled, so that the form sends only the picked models' variables;
   the chat's is set to its model's own value. An arena side left random makes a blind battle, which takes none. */
(function () {
  "use strict";
  var boxes = document.querySelectorAll("[data-template-variable]");
  var form = boxes.length ? boxes[0].form : null;
  if (!form) return;
  var chat = form.querySelector("select[name=model]");
  var selects = chat ? [chat] : Array.prototype.slice.call(
    form.querySelectorAll("select[name=model_a], select[name=model_b]"));
  if (!selects.length) return;
  var section = document.getElementById("arena-variables");
  function update() {
    var picked = selects.map(function (select) { return select.value; });
    var named = picked.indexOf("") < 0;
    var shown = false;
    Array.prototype.forEach.call(boxes, function (box) {
      var readers = JSON.parse(box.dataset.templateVariable);
      var reader = picked.filter(function (ref) { return Object.prototype.hasOwnProperty.call(readers, ref); })[0];
      var reads = named && reader !== undefined;
      box.closest(".field").hidden = !reads;
      box.disabled = !reads;
      if (reads && chat) box.value = readers[reader];
      shown = shown || reads;
    });
    if (section) section.hidden = !shown;
  }
  selects.forEach(function (select) { select.addEventListener("change", update); });
})();
