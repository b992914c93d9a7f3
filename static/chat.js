// Chat page: send a turn, follow the answer's server-sent events, stop, regenerate.
// Model text is only ever written with textContent while it streams; the finished answer is
// swapped for the server's rendering (sanitized Markdown).
(function () {
  "use strict";
  const log = document.getElementById("chat-log");
  const form = document.getElementById("chat-form");
  if (!log || !form) return;
  const csrf = form.querySelector("input[name=csrfmiddlewaretoken]").value;
  const sendButton = document.getElementById("chat-send");
  const stopButton = document.getElementById("chat-stop");
  const regenerateButton = document.getElementById("chat-regenerate");
  const errorBox = document.getElementById("chat-error");
  const textBox = form.querySelector("textarea");
  // Screen readers hear that the model is writing, then its finished answer once: the streaming text is
  // not live, or each token would be read out as it arrives.
  const announcer = document.getElementById("chat-announce");
  const messagesUrl = log.dataset.messages;
  let stopUrl = null;

  // Each send and regenerate carries a one-time token (webapp/core/submissions.py): a double click, or a request
  // the browser sends again, carries the same one, and the server answers it with the first's answer to follow
  // rather than take a second turn (or refuse it: "still being written"). A send the server took draws the next.
  function newToken() {
    const bytes = crypto.getRandomValues(new Uint8Array(18));
    return Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
  }
  const tokens = {send: newToken(), regenerate: newToken()};
  function once(kind, body) {
    body.set("submission_token", tokens[kind]);
    return body;
  }
  // The server took a sending of this kind: the next draws a new token.
  function taken(kind) {
    tokens[kind] = newToken();
  }
  // Whether an answer is on the page already (the same sending answered twice, for a double click: shown once).
  function shownAlready(data) {
    return Boolean(document.getElementById(data.message));
  }

  function bubble(role, id) {
    const div = document.createElement("div");
    div.className = "chat-message chat-" + role + (role === "assistant" ? " status-streaming" : "");
    if (id) div.id = id;
    const who = document.createElement("div");
    who.className = "chat-role";
    who.textContent = role === "user" ? "You" : "Model";
    const text = document.createElement("div");
    text.className = "chat-text chat-plain" + (role === "assistant" ? " chat-streaming" : "");
    div.append(who, text);
    log.append(div);
    return text;
  }

  // Send and Regenerate are disabled while an answer is written and Stop is hidden after it: the focus on
  // one of them would fall to the page's body, so it moves to Stop, then back to the message box.
  function busy(on) {
    const focused = document.activeElement;
    sendButton.disabled = on;
    regenerateButton.disabled = on;
    stopButton.hidden = !on;
    if (on && (focused === sendButton || focused === regenerateButton)) stopButton.focus();
    if (!on && (focused === stopButton || focused === document.body)) textBox.focus();
  }

  function announceAnswer(element) {
    const text = element.querySelector(".chat-text, .chat-empty");
    const note = element.querySelector(".chat-note");
    const said = text ? text.textContent.replace(/\s+/g, " ").trim() : "";
    if (element.dataset.status === "failed") announcer.textContent = "The answer failed: " + said;
    else announcer.textContent = "The model answered" + (note ? " " + note.textContent : "") + ": " + said;
  }

  async function post(url, body) {
    const response = await fetch(url, {method: "POST", body: body || new FormData(), headers: {"X-CSRFToken": csrf}});
    const text = await response.text();
    let data;
    try { data = JSON.parse(text); } catch (error) { data = {error: pageMessage(text)}; }
    if (!response.ok) {
      const refusal = new Error(data.error || ("the server answered " + response.status));
      refusal.fields = data.errors || {};  // a 400's problems by field
      throw refusal;
    }
    return data;
  }

  // A message refused for its text marks the box and ties it to why (the alert beside the buttons), and
  // takes the focus back there to be fixed; the next send clears the mark.
  function markRefused(refused) {
    if (refused) {
      textBox.setAttribute("aria-invalid", "true");
      textBox.setAttribute("aria-describedby", "chat-error");
      textBox.focus();
    } else {
      textBox.removeAttribute("aria-invalid");
      textBox.removeAttribute("aria-describedby");
    }
  }

  // A refusal that comes as one of Temper's pages (403: "this needs the member role in alpha; you are a
  // viewer"): its message, as text.
  function pageMessage(html) {
    const message = new DOMParser().parseFromString(html, "text/html").querySelector("main .card p");
    return message ? message.textContent.trim() : null;
  }

  // Whether the page's last message is the one the server put before the new turn: another tab on this
  // conversation may have taken a turn meanwhile, and the new answer would show under a turn it did not answer.
  // If not, the page is loaded again (it follows the new answer from there).
  function showsLast(previous) {
    const last = log.querySelector(".chat-message:last-child");
    if ((last ? last.id : "") === previous) return true;
    window.location.reload();
    return false;
  }

  function follow(id) {
    const element = document.getElementById(id);
    const text = element.querySelector(".chat-streaming");
    stopUrl = messagesUrl + id + "/stop/";
    busy(true);
    announcer.textContent = "The model is writing its answer.";
    const source = window.TemperFollowAnswer(messagesUrl + id + "/events/", text, async () => {
      const shown = await window.TemperShowDoneAnswer(element, messagesUrl + id + "/",
        (why) => "The answer is done, but it could not be loaded (" + why + "): reload the page to see it.");
      if (shown) announceAnswer(shown);
      else announcer.textContent = "";  // the element's alert says why
      busy(false);
    });
    source.onerror = () => { if (source.readyState === EventSource.CLOSED) busy(false); };
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    errorBox.textContent = "";
    const body = once("send", new FormData(form));
    try {
      const data = await post(log.dataset.send, body);
      textBox.value = "";  // sent: not restored into the box by a reload
      markRefused(false);
      taken("send");
      if (shownAlready(data) || !showsLast(data.previous)) return;
      if (data.title) {  // named by its first turn: the heading and the tab (its title isolated, as served)
        document.getElementById("chat-title").textContent = data.title;
        document.title = "\u2068" + data.title + "\u2069" + document.title.slice(document.title.indexOf(" · "));
      }
      const sent = bubble("user");
      sent.textContent = body.get("content");
      sent.parentElement.id = data.user_message;
      bubble("assistant", data.message);
      follow(data.message);
    } catch (error) {
      errorBox.textContent = error.message;
      markRefused(Boolean(error.fields && error.fields.content));
    }
  });

  // An empty box is stopped by the browser (the box is required, and says so) before the submit handler, which
  // clears the error beside the buttons: cleared here too, or an earlier one (Regenerate's) stood as the reason.
  textBox.addEventListener("invalid", () => {
    errorBox.textContent = "";
    markRefused(false);
  });

  // Enter sends, as in every chat; Shift+Enter (or Enter while an input method composes) adds a line.
  textBox.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    if (!sendButton.disabled) form.requestSubmit();
  });

  stopButton.addEventListener("click", async () => {
    try { if (stopUrl) await post(stopUrl); } catch (error) { errorBox.textContent = error.message; }
  });

  regenerateButton.addEventListener("click", async () => {
    errorBox.textContent = "";
    try {
      const data = await post(log.dataset.regenerate, once("regenerate", new FormData()));
      taken("regenerate");
      if (shownAlready(data)) return;
      const answers = log.querySelectorAll(".chat-assistant");
      if (answers.length) answers[answers.length - 1].remove();
      if (!showsLast(data.previous)) return;
      bubble("assistant", data.message);
      follow(data.message);
    } catch (error) {
      errorBox.textContent = error.message;
    }
  });

  const streaming = log.querySelector(".chat-assistant.status-streaming:last-child");
  if (streaming) follow(streaming.id);
})();
