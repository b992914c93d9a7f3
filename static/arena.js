// Battle page: follow both answers' server-sent events in parallel. Model text is only written with
// textContent while it streams; the finished answer is swapped for the server's sanitized rendering.
(function () {
  "use strict";
  document.querySelectorAll(".arena-side").forEach((side) => {
    const streaming = side.querySelector(".chat-streaming");
    if (!streaming) return;
    const source = new EventSource(side.dataset.events);
    // A stream that ends before the answer does (after the server's time limit, or cut by the network) is
    // opened again by the EventSource itself, and the server replays the answer's events from its first.
    let lastSeq = -1;
    source.onmessage = async (event) => {
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
      const response = await fetch(side.dataset.html);
      if (response.ok) side.querySelector(".chat-message").outerHTML = await response.text();
      openVoteWhenDone();
    };
  });

  // The server refuses a vote before both answers are done; the buttons open when they are.
  function openVoteWhenDone() {
    if (document.querySelector(".arena-side .chat-streaming")) return;
    // A failed answer rates nothing: the server's page says so and offers the prompt again.
    if (document.querySelector('.arena-side .chat-message[data-status="failed"]')) {
      window.location.reload();
      return;
    }
    document.querySelectorAll(".arena-vote button").forEach((button) => { button.disabled = false; });
    document.querySelectorAll(".arena-vote-wait").forEach((note) => { note.hidden = true; });
    // The buttons open in place: a screen reader hears it from this live region.
    const status = document.getElementById("arena-vote-status");
    if (status) status.textContent = "Both answers are done: the vote is open.";
  }
})();
