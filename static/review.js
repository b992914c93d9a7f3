// Reviewing page: keyboard shortcuts for the answer buttons and the edit boxes.
// 1 first better · 2 second better · t tie · b both bad · s skip · e edit (Esc leaves a text box).
// The letters and digits answer only while the reviewer's preference leaves them on (data-shortcuts):
// WCAG 2.1.4, a speech-input user or a stray key press sends them by accident.
(function () {
  "use strict";
  const form = document.getElementById("review-form");
  if (!form) return;
  const edits = form.querySelectorAll("textarea.edit");
  const shortcuts = form.dataset.shortcuts === "on";
  let sent = false;

  function startEditing() {
    // Edit boxes are disabled until asked for, so an untouched page sends no edit at all.
    edits.forEach(function (box) { box.disabled = false; box.hidden = false; });
    form.classList.add("editing");
    edits[0].focus();
  }

  form.querySelector(".edit-toggle").addEventListener("click", startEditing);
  form.addEventListener("submit", function (event) {
    if (sent) { event.preventDefault(); return; }  // one answer per item, even on a double key press
    sent = true;
  });

  document.addEventListener("keydown", function (event) {
    const target = event.target;
    const typing = target instanceof HTMLTextAreaElement || target instanceof HTMLInputElement;
    if (typing) {
      if (event.key === "Escape") target.blur();
      return;
    }
    if (!shortcuts || event.ctrlKey || event.metaKey || event.altKey) return;
    // Caps Lock sends "T" for t: the letters answer in either case.
    const key = event.key.length === 1 ? event.key.toLowerCase() : event.key;
    if (key === "e") {
      event.preventDefault();
      startEditing();
      return;
    }
    const button = form.querySelector('button[type=submit][data-key="' + CSS.escape(key) + '"]');
    if (button) {
      event.preventDefault();
      button.click();
    }
  });
})();
