// pgqueue web: refresh the parts of a page marked data-refresh every 5 s while
// the tab is visible, by fetching the same page and swapping those parts in.
// No framework, no inline script: the page works without this file.
(function () {
  "use strict";
  var PERIOD = 5000;
  var parts = document.querySelectorAll("[data-refresh][id]");
  if (!parts.length) return;
  var busy = false;
  function refresh() {
    if (busy || document.hidden) return;
    if (document.activeElement && document.activeElement.closest("[data-refresh]")) return;
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Requested-With": "refresh" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        parts.forEach(function (el) {
          var fresh = doc.getElementById(el.id);
          if (fresh) el.replaceChildren.apply(el, Array.prototype.slice.call(fresh.childNodes).map(function (n) { return document.importNode(n, true); }));
        });
      })
      .catch(function () {})
      .finally(function () { busy = false; });
  }
  setInterval(refresh, PERIOD);
  document.addEventListener("visibilitychange", refresh);
})();
