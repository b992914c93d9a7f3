/* The launch page: switch between the schema-built form and the YAML editor of the same spec, the
   live check of an editor against the launch's own rules, and the Scale-out fieldset's running check
   of data x fsdp x tensor against the devices of the job. Its reward-function lists are reward_rows.js's. */
(function () {
  "use strict";
  var tabs = document.querySelectorAll("nav.tabs.small a[data-mode]");
  function show(mode) {
    document.querySelectorAll("form.launch-form").forEach(function (form) { form.hidden = form.dataset.mode !== mode; });
    tabs.forEach(function (tab) {
      tab.classList.toggle("active", tab.dataset.mode === mode);
      if (tab.dataset.mode === mode) tab.setAttribute("aria-current", "true"); else tab.removeAttribute("aria-current");
    });
  }
  // Each switch loads the page again: the page it loads puts the focus back where the switch was made
  // (the editor tab used, or the notice of what a task or preset switch kept), not at the top of the
  // page, some thirty Tabs from the editor. Remembered for the next page of this tab only.
  var SWITCHED = "temper-launch-switched";
  function remember(name) {
    try { window.sessionStorage.setItem(SWITCHED, name); } catch (error) { /* storage off: focus stays at the top */ }
  }
  function switchMade() {
    try {
      var name = window.sessionStorage.getItem(SWITCHED);
      window.sessionStorage.removeItem(SWITCHED);
      return name;
    } catch (error) { return null; }
  }
  // Send the shown editor with ``name`` = ``value`` added: the server answers with the page asked for,
  // holding what was typed in it. ``address``, when given, is where it is posted, so that it is the address
  // bar's afterwards (the view reads a POST's form only).
  function sendShown(name, value, address) {
    remember(name);
    var shown = document.querySelector("form.launch-form:not([hidden])");
    if (address) shown.setAttribute("action", address);
    var target = document.createElement("input");
    target.type = "hidden";
    target.name = name;
    target.value = value;
    shown.appendChild(target);
    shown.submit();
  }
  // A task tab or preset asks for its page with the shown editor's inputs in the address (a GET: reloading
  // or going back shows the page again, sending no form, and the address can be shared), less the tokens
  // that guard a POST and the inputs left blank (a blank keeps nothing across a switch).
  // An address past LONGEST_ADDRESS characters (a long YAML spec) is sent as the form it was instead: servers
  // refuse request lines of some 8-16 KB, and the switch would lose what was typed.
  var POST_ONLY = ["csrfmiddlewaretoken", "submission_token"];
  var LONGEST_ADDRESS = 6000;
  function openWithShown(params) {
    var shown = document.querySelector("form.launch-form:not([hidden])");
    var query = new URLSearchParams();
    new FormData(shown).forEach(function (value, name) {
      if (POST_ONLY.indexOf(name) === -1 && name !== "task" && typeof value === "string" && value.trim() !== "") {
        query.append(name, value);
      }
    });
    query.set("from_task", shown.querySelector('input[name="task"]').value);
    Object.keys(params).forEach(function (name) { query.set(name, params[name]); });
    var address = window.location.pathname + "?" + query.toString();
    if (address.length > LONGEST_ADDRESS) {
      // Posted to the page's current address, the switch left it there: after a switch by GET, one of another
      // task, which reloading or sharing showed instead. It goes to the bare address of the page asked for
      // (not with ``#yaml``: a launch from the page answered is posted there too, and a redirect keeps a fragment).
      var asked = window.location.pathname + "?" + new URLSearchParams(params).toString();
      if (params.preset) sendShown("apply_preset", params.preset, asked); else sendShown("switch_task", params.task, asked);
      return;
    }
    remember("switch_task");
    window.location.assign(address);
  }
  // Each editor is a form of its own: a bare switch showed the other as first served, and launching
  // it lost what was typed.
  tabs.forEach(function (tab) {
    tab.addEventListener("click", function (event) {
      event.preventDefault();
      var shown = document.querySelector("form.launch-form:not([hidden])");
      if (shown && shown.dataset.mode !== tab.dataset.mode) sendShown("switch", tab.dataset.mode);
    });
  });
  if (window.location.hash === "#yaml") show("yaml");
  // The spec takes one key of each rival pair (train.max_steps or train.epochs) and a preset fills one:
  // typing a value in the other clears it, where the launch was refused with both given.
  var launchForm = document.getElementById("launch-form");
  JSON.parse((launchForm && launchForm.dataset.rivals) || "[]").forEach(function (pair) {
    pair.forEach(function (name) {
      var input = launchForm.querySelector('[name="' + name + '"]');
      if (!input) return;
      input.addEventListener("input", function () {
        if (input.value.trim() === "") return;
        pair.forEach(function (other) {
          var rival = other !== name && launchForm.querySelector('[name="' + other + '"]');
          if (rival) rival.value = "";
        });
      });
    });
  });
  // data.max_seq_len may not pass the chosen model's positions (the launch refuses it): each model option says
  // them, the field's help says the chosen one's, and until someone types in the field it starts within them.
  var modelSelect = document.getElementById("spec-model");
  document.querySelectorAll("input[data-unlimited]").forEach(function (input) {
    var limit = document.querySelector("#" + input.id + "-help .model-limit");
    input.addEventListener("input", function () { input.dataset.typed = "true"; });
    if (!modelSelect || !limit) return;
    modelSelect.addEventListener("change", function () {
      var option = modelSelect.options[modelSelect.selectedIndex];
      var positions = parseInt((option && option.dataset.positions) || "", 10);
      limit.textContent = positions ? "At most " + positions + ": the model's context." : "";
      var unlimited = parseInt(input.dataset.unlimited, 10);
      if (input.dataset.typed || !unlimited) return;
      input.value = String(positions ? Math.min(unlimited, positions) : unlimited);
    });
  });

  // As bare links the task tabs dropped everything typed; the server keeps the values chosen (without
  // JavaScript they stay links).
  document.querySelectorAll("nav.tabs a[data-task]").forEach(function (tab) {
    tab.addEventListener("click", function (event) {
      if (tab.classList.contains("active") || !document.querySelector("form.launch-form:not([hidden])")) return;
      event.preventDefault();
      openWithShown({task: tab.dataset.task});
    });
  });

  // So did the presets, which were links too: the model, data and name picked were gone. The server
  // applies the preset and keeps the values chosen, as for a task switch.
  document.querySelectorAll(".presets a[data-preset]").forEach(function (link) {
    link.addEventListener("click", function (event) {
      if (!document.querySelector("form.launch-form:not([hidden])")) return;
      event.preventDefault();
      openWithShown({task: document.querySelector('form.launch-form:not([hidden]) input[name="task"]').value,
                     preset: link.dataset.preset});
    });
  });

  // A refused launch (or switch) lists its problems above the editor: start there, not at the top of
  // the page, so that a keyboard or screen-reader user reads them first and tabs on into the fields.
  var problems = document.getElementById("launch-errors");
  var switched = switchMade();
  if (problems) problems.focus();
  else if (switched === "switch") (document.querySelector("nav.tabs.small a.active") || document.body).focus();
  else if (switched) (document.getElementById("task-switched") || document.body).focus();

  // A live check of each editor as it is filled in: what a launch would be refused for and what it
  // would warn of (a warmup as long as the run, evaluations with no evaluation data), asked of the
  // server, which runs the launch's own checks and saves nothing. Only after a first edit: a fresh
  // form lacks its model and data, and saying so before anything is typed is noise.
  function renderCheck(panel, result) {
    var keys = Object.keys(result.errors || {});
    var warnings = result.warnings || [];
    var heading = document.createElement("p");
    var list = document.createElement("ul");
    keys.forEach(function (key) {
      result.errors[key].forEach(function (message) {
        var item = document.createElement("li");
        if (key !== "__all__" && key !== "spec_yaml") {
          var code = document.createElement("code");
          code.textContent = key;
          item.appendChild(code);
          item.appendChild(document.createTextNode(": "));
        }
        item.appendChild(document.createTextNode(message));
        list.appendChild(item);
      });
    });
    warnings.forEach(function (message, index) {
      var item = document.createElement("li");
      item.textContent = message;
      // A warning Temper can act on links to where it does so (a dataset version's "Remove the exact repeats").
      var action = (result.actions || [])[index];
      if (action) {
        var link = document.createElement("a");
        link.className = "warning-action";
        link.href = action.url;
        link.textContent = action.label;
        item.appendChild(document.createTextNode(" "));
        item.appendChild(link);
      }
      list.appendChild(item);
    });
    heading.textContent = keys.length ? "A launch now would be refused:" :
      (warnings.length ? "Ready to launch, with " + (warnings.length === 1 ? "a warning" : "warnings") + ":" : "Ready to launch.");
    panel.className = "launch-check " + (keys.length ? "refused" : (warnings.length ? "warned" : "ready"));
    panel.replaceChildren(heading);
    if (list.children.length) panel.appendChild(list);
    // The memory a device would need (jaxengine/memory.py), a guide whether or not it warns.
    (result.memory || []).forEach(function (line) {
      var memory = document.createElement("p");
      memory.className = "memory-estimate muted";
      memory.textContent = "Memory: " + line + ".";
      panel.appendChild(memory);
    });
    panel.hidden = false;
  }
  document.querySelectorAll("form.launch-form[data-check-url]").forEach(function (form) {
    var panel = form.querySelector(".launch-check");
    var timer = null;
    var asked = 0;
    function check() {
      var number = ++asked;
      fetch(form.dataset.checkUrl, { method: "POST", body: new FormData(form), credentials: "same-origin" })
        .then(function (response) {
          if (!response.ok) throw new Error("the server answered " + response.status);
          return response.json();
        })
        .then(function (result) {
          if (number !== asked) return;
          renderCheck(panel, result);
          // A worker is counting what a warning will say (an old dataset version's turn splits), as the
          // version's page does: ask again in a moment, unless an edit asks first.
          if (result.counting) { clearTimeout(timer); timer = setTimeout(check, 2000); }
        })
        .catch(function (error) {
          if (number !== asked) return;
          panel.className = "launch-check";
          panel.textContent = "Not checked (" + error.message + "); Launch checks everything again.";
          panel.hidden = false;
        });
    }
    function checkSoon() {
      clearTimeout(timer);
      timer = setTimeout(check, 400);
    }
    form.addEventListener("input", checkSoon);
    form.addEventListener("change", checkSoon);
    // The reward rows' Add and Remove buttons change the spec without an input event.
    form.addEventListener("click", function (event) {
      if (event.target.closest("button.reward-add, button.reward-remove")) checkSoon();
    });
  });

  // A hint only: the server checks the same rule (against the same heartbeats) when the run is launched.
  var scaleOut = document.getElementById("scale-out");
  if (scaleOut) {
    var sizes = ["data", "fsdp", "tensor"].map(function (axis) { return document.getElementById("spec-parallel-" + axis); });
    var hosts = document.getElementById("spec-hosts");
    var pool = document.getElementById("spec-pool");
    var check = document.getElementById("layout-check");
    // A job of more hosts than its pool has live workers is not refused (the pool may grow), but it
    // waits until the pool has them, and fails after the placement timeout: say so before the launch.
    var hostsNote = function (hostCount) {
      var option = pool.selectedOptions[0];
      var workers = option ? Number(option.dataset.workers) : 0;
      if (!(hostCount > 1) || !(workers > 0) || hostCount <= workers) { return ""; }
      return " Pool " + pool.value + " has " + workers + " live worker" + (workers === 1 ? "" : "s") + ": a job of " +
        hostCount + " hosts waits for " + (hostCount - workers) + " more to start.";
    };
    var updateCheck = function () {
      var given = sizes.filter(function (input) { return input.value.trim() !== ""; });
      var hostCount = hosts && hosts.value.trim() !== "" ? Number(hosts.value) : 1;
      var note = hostsNote(hostCount);
      check.classList.toggle("mismatch", note !== "");
      if (!given.length) { check.textContent = "Default layout." + note; return; }
      var product = sizes.reduce(function (total, input) { return total * (Number(input.value.trim() || "1")); }, 1);
      var perWorker = pool.selectedOptions[0] ? pool.selectedOptions[0].dataset.devices : "";
      var text = "data × fsdp × tensor = " + product + " devices";
      if (perWorker && Number.isFinite(product) && Number.isFinite(hostCount)) {
        var devices = hostCount * Number(perWorker);
        text += "; pool " + pool.value + " gives " + hostCount + " × " + perWorker + " = " + devices;
        check.classList.toggle("mismatch", product !== devices || note !== "");
      }
      check.textContent = text + "." + note;
    };
    sizes.concat([hosts, pool]).forEach(function (input) {
      if (input) { input.addEventListener("input", updateCheck); input.addEventListener("change", updateCheck); }
    });
    updateCheck();
  }
})();
