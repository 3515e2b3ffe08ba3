// Kagzi console: the auto-refresh toggle. A page that offers it (data-refresh on
// <body>, in seconds) reloads itself while the box is ticked; the choice is kept for
// the browser in localStorage. A page never reloads while a form field (other than the
// toggle itself) has focus. The "done" parameter of a page an action led to is
// dropped from the address, so that a reload does not show the action's message again.
(function () {
  "use strict";
  var secs = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  var box = document.getElementById("autorefresh");
  if (!box || !secs) { return; }
  var key = "kagzi.console.autorefresh";
  var timer = null;
  function schedule() {
    clearTimeout(timer);
    if (!box.checked) { return; }
    timer = setTimeout(function () {
      var a = document.activeElement;
      if (a && a !== box && (a.tagName === "INPUT" || a.tagName === "SELECT" || a.tagName === "TEXTAREA")) { schedule(); return; }
      window.location.reload();
    }, secs * 1000);
  }
  try { box.checked = window.localStorage.getItem(key) === "1"; } catch (e) { /* storage disabled */ }
  box.addEventListener("change", function () {
    try { window.localStorage.setItem(key, box.checked ? "1" : "0"); } catch (e) { /* storage disabled */ }
    schedule();
  });
  schedule();
})();

(function () {
  "use strict";
  if (!window.history || !window.history.replaceState || !window.URL) { return; }
  var u = new URL(window.location.href);
  if (!u.searchParams.has("done")) { return; }
  u.searchParams.delete("done");
  window.history.replaceState(null, "", u.pathname + u.search + u.hash);
})();
