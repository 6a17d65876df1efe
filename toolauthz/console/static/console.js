// The live expiry countdown of approvals. The page renders the expiry time itself, so
// without this script the time is still there; with it, every element with
// `data-expires-epoch` and class `countdown` counts down, and once an approval has
// expired its decision form is hidden and one status message says so (the server
// refuses a late decision anyway).
(function () {
  "use strict";

  function left(seconds) {
    if (seconds <= 0) { return "expired"; }
    var h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = Math.floor(seconds % 60);
    return "expires in " + (h ? h + "h " : "") + (h || m ? m + "m " : "") + s + "s";
  }

  function tick() {
    var now = Date.now() / 1000;
    document.querySelectorAll(".countdown[data-expires-epoch]").forEach(function (el) {
      var remaining = parseFloat(el.getAttribute("data-expires-epoch")) - now;
      el.textContent = left(remaining);
      if (remaining <= 0) {
        el.classList.add("expired");
        var form = document.getElementById("decide-form");
        if (form && !form.hidden) {
          form.hidden = true;
          // One announcement, in the page's role=status region (present from the start,
          // so that screen readers follow it).
          var status = document.getElementById("expiry-status");
          if (status) {
            status.textContent = "This approval has expired: it can no longer be decided. " +
              "The runtime must propose the call again.";
          }
        }
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    tick();
    window.setInterval(tick, 1000);
  });
}());
