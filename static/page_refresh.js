/* A page that follows work under way (a version being checked or counted, an evaluation, a campaign's load or
   generation, a pipeline) reads itself again every few seconds (templates/_refresh.html; its <noscript> refresh
   does it without scripts). A reload wiped what the user was typing into the page's forms (a version's split form,
   its token count's model) and closed an open confirmation (Delete…, Cancel…) under their pointer, so it holds back
   while a field has been changed, the focus is in one, or a dialog, a confirmation or another open disclosure
   holding a form is open, and says so in a live note. Submitting or resetting a form counts its changes as gone. */
(function () {
  "use strict";
  const period = (Number(document.currentScript.dataset.seconds) || 3) * 1000;
  const PAUSED = "Updates paused while you edit — reload to see them";
  // Inputs that take no typing: a focus on them holds nothing back.
  const BUTTONS = new Set(["button", "submit", "reset", "image", "hidden"]);
  const changed = new Set();  // the forms whose fields the user changed (the document for a field outside one)
  let timer = null;

  // A live region present, empty, from the load on: a screen reader announces what is later written in it.
  const note = document.createElement("p");
  note.className = "refresh-note";
  note.setAttribute("role", "status");
  document.body.append(note);

  function isField(element) {
    if (!(element instanceof HTMLElement)) return false;
    if (element.isContentEditable || element.matches("select, textarea")) return true;
    return element.matches("input") && !BUTTONS.has(element.type);
  }

  function dialogOpen() {
    return document.querySelector("dialog[open]") !== null ||
      Array.from(document.querySelectorAll("details[open]")).some(
        (details) => details.querySelector("form, input, select, textarea, button") !== null);
  }

  function holdingBack() {
    return changed.size > 0 || isField(document.activeElement) || dialogOpen();
  }

  function say() {
    const text = holdingBack() ? PAUSED : "";
    if (note.textContent !== text) note.textContent = text;
  }

  function again() {
    if (holdingBack()) {
      say();
      wait();
      return;
    }
    window.location.reload();
  }

  function wait() {
    clearTimeout(timer);
    timer = setTimeout(again, period);
  }

  // Only what the user does: a page's own script setting a field (isTrusted false) changes nothing of theirs.
  function userChanged(event) {
    if (!event.isTrusted || !isField(event.target)) return;
    changed.add(event.target.form || document);
    say();
  }
  document.addEventListener("input", userChanged, true);
  document.addEventListener("change", userChanged, true);

  function formDone(event) {
    changed.delete(event.target);
    say();
  }
  document.addEventListener("reset", formDone, true);
  document.addEventListener("submit", function (event) {
    formDone(event);
    wait();  // a whole period for the submission's answer: a reload now would cancel its navigation
  }, true);
  // A confirmation closed, or the focus left its field: the note goes once nothing else holds the reload back.
  document.addEventListener("toggle", say, true);
  document.addEventListener("focusout", function () { setTimeout(say); }, true);

  wait();
})();
