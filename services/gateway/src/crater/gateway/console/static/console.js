// The live dot in the header: green while the event stream is open, grey while it
// reconnects. htmx and its SSE extension do the rest.
(function () {
  function mark(state, title) {
    var dot = document.getElementById("live");
    if (dot) { dot.className = "live " + state; dot.title = "live updates: " + title; }
  }
  document.addEventListener("htmx:sseOpen", function () { mark("on", "connected"); });
  document.addEventListener("htmx:sseError", function () { mark("off", "reconnecting"); });
  document.addEventListener("htmx:sseMessage", function () {
    mark("on", "connected, last event " + new Date().toLocaleTimeString());
  });
})();
