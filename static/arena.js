// Battle page: follow both answers' server-sent events in parallel (answer_stream.js); the finished answer is
// swapped for the server's sanitized rendering (loaded again after a failure; a side whose answer could not be
// loaded says to reload the page, and the vote stays closed: its answer was not seen).
(function () {
  "use strict";
  document.querySelectorAll(".arena-side").forEach((side) => {
    const streaming = side.querySelector(".chat-streaming");
    if (!streaming) return;
    window.TemperFollowAnswer(side.dataset.events, streaming, async () => {
      const shown = await window.TemperShowDoneAnswer(side.querySelector(".chat-message"), side.dataset.html,
        (why) => "Answer " + side.dataset.name + " is done, but it could not be loaded (" + why +
          "): reload the page to see it and vote.");
      if (shown) openVoteWhenDone();
    });
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
