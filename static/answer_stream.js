/* An answer being written, followed over its server-sent events, for the chat page and the arena's battle page.
   The model's text is only written with textContent into the streaming element; once the answer ends ("done" or
   "error") the stream is closed and ended() is called, which swaps in the server's rendering. The EventSource is
   returned for the caller's own handlers (the chat page's onerror). */
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
