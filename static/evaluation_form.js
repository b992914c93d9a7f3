/* The New evaluation page: the reward functions' rows shown only while "Score by: reward functions" is chosen.
   Without this script they stay shown, and the server reads them only when that is chosen (evals.views). */
(function () {
  "use strict";
  var form = document.getElementById("new-evaluation");
  var rewards = document.getElementById("reward-functions");
  if (!form || !rewards) return;
  var choices = form.querySelectorAll("input[name=score_by]");
  if (!choices.length) return;

  function show() {
    var chosen = form.querySelector("input[name=score_by]:checked");
    rewards.hidden = !chosen || chosen.value !== "rewards";
  }

  choices.forEach(function (choice) { choice.addEventListener("change", show); });
  show();
})();
