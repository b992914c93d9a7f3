/* An answer being written, followed over its server-sent events, for the chat page and the arena's battle page.
   The model's text is only written with textContent into the streaming element; once the answer ends ("done" or
   "error") the stream is closed and ended() is called, which swaps in the server's rendering (TemperShowDoneAnswer,
   below). The EventSource is returned for the caller's own handlers (the chat page's onerror). */
window.TemperFollowAnswer = function (eventsUrl, streaming, ended) {
  "use strict";
  const source = new EventSource(eventsUrl);
  // A stream that ends before the answer does (after the server's time limit, or cut by the network) is
  // opened again by the EventSource itself, and the server replays the answer's events from its first.
  let lastSeq = -1;
  source.onmessage = (event) => {
    const data = JSON.parse(event.data);
    if ((data.type === "token" || data.type === "status") && data.seq <= lastSeq) return;  // shown already
    if (typeof data.seq === "number") lastSeq = Math.max(lastSeq, data.seq);
    if (data.type === "token") {
      streaming.textContent += data.text;
      return;
    }
    if (data.type === "status") {  // shown by the stylesheet until the first token
      streaming.dataset.status = data.message;
      return;
    }
    // "unavailable": the server lost Redis (or this page read too slowly) and ends the stream; the answer goes on,
    // and the EventSource, left open, reconnects by itself to follow it again.
    if (data.type !== "done" && data.type !== "error") return;
    source.close();
    ended();
  };
  return source;
};

/* A done answer's element swapped for the server's rendering of it (chat:message, sanitized Markdown), on the chat
   page and the battle page. A load that fails for a network error or a server error (a 5xx: a restart, a proxy's
   502) is tried again after RETRY_DELAYS_MS, each wait twice the one before, as one lost once would otherwise leave
   the answer unrendered (the arena's vote closed, the chat's buttons waiting) until a reload; a refusal (a 4xx) is
   not. Given up, the element says so with notLoaded(why) (what to do included) as an alert. Resolves to the new
   element, or null when it was not loaded. */
window.TemperShowDoneAnswer = (function () {
  "use strict";
  const RETRY_DELAYS_MS = [1000, 2000, 4000, 8000, 16000];
  const wait = (milliseconds) => new Promise((resolve) => { window.setTimeout(resolve, milliseconds); });

  async function load(url) {
    for (let attempt = 0; ; attempt += 1) {
      let why;
      let again = true;
      try {
        const response = await fetch(url);
        if (response.ok) return await response.text();
        why = "the server answered " + response.status;
        again = response.status >= 500;
      } catch (error) {  // fetch's TypeError: no answer from the server (or the body cut short)
        why = "the server could not be reached";
      }
      if (!again || attempt >= RETRY_DELAYS_MS.length) throw new Error(why);
      await wait(RETRY_DELAYS_MS[attempt]);
    }
  }

  return async function (element, url, notLoaded) {
    let html;
    try {
      html = await load(url);
    } catch (error) {
      const note = document.createElement("p");
      note.className = "error answer-not-loaded";
      note.setAttribute("role", "alert");
      note.textContent = notLoaded(error.message);
      element.append(note);
      return null;
    }
    const id = element.id;
    element.outerHTML = html;
    return document.getElementById(id);
  };
})();
