// The admin page's live parts, by server-sent events: a running turn's draft on a thread's
// page, the outbox table. Everything shown is set as text, except the outbox rows, which the
// server renders (escaped) for this page.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const draft = document.getElementById("live-draft");
  if (draft && draft.dataset.live) {
    const status = document.getElementById("live-status");
    const events = new EventSource(draft.dataset.live);
    events.addEventListener("delta", (e) => {
      const data = JSON.parse(e.data);
      draft.textContent += data.text;
      if (status) status.textContent = "writing…";
    });
    events.addEventListener("tool", (e) => {
      const data = JSON.parse(e.data);
      if (status) status.textContent = "tool " + data.name + ": " + data.state;
    });
    events.addEventListener("final", () => {
      events.close();
      window.location.reload();
    });
  }
  const rows = document.getElementById("outbox-rows");
  if (rows && rows.dataset.live) {
    const events = new EventSource(rows.dataset.live);
    events.addEventListener("outbox", (e) => {
      rows.innerHTML = JSON.parse(e.data).html;
    });
  }
});
