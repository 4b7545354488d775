// The models-in-memory panel: GET /runtime every few seconds while the page is visible.

import { getJson, postJson } from "./api.js";
import { element } from "./form.js";

const REFRESH_MS = 2000;
const MIB = 1024 * 1024;

function mib(bytes) {
  return (bytes / MIB).toFixed(1);
}

function replicaText(replicas) {
  const healthy = replicas.filter((replica) => replica.healthy).length;
  const count = String(replicas.length);
  return healthy === replicas.length ? count : `${count} (${healthy} healthy)`;
}

export class RuntimePanel {
  // onError(error) shows an API error; onMessage(text) says what an unload did.
  constructor(root, { onError, onMessage }) {
    this.body = root.querySelector("tbody");
    this.empty = root.querySelector(".empty");
    this.unloadIdle = root.querySelector("#unload-idle");
    this.onError = onError;
    this.onMessage = onMessage;
    this.timer = null;
    this.inFlight = null;
    this.unloadIdle.addEventListener("click", () => this.unload(null));
    document.addEventListener("visibilitychange", () => this.schedule());
  }

  start() {
    this.schedule();
  }

  // Refresh now, then every REFRESH_MS while the page is visible.
  schedule() {
    clearInterval(this.timer);
    this.timer = null;
    if (document.visibilityState !== "visible") return;
    this.refresh();
    this.timer = setInterval(() => this.refresh(), REFRESH_MS);
  }

  refresh() {
    if (!this.inFlight) {
      this.inFlight = getJson("/runtime")
        .then((runtime) => this.render(runtime.models))
        .catch((error) => this.onError(error))
        .finally(() => {
          this.inFlight = null;
        });
    }
    return this.inFlight;
  }

  render(models) {
    this.body.replaceChildren(...models.map((model) => this.row(model)));
    this.empty.hidden = models.length > 0;
    this.unloadIdle.disabled = !models.some((model) => model.state === "idle");
  }

  row(model) {
    const unload = element("button", { type: "button", class: "unload", text: "Unload" });
    unload.addEventListener("click", () => this.unload(model.name));
    return element(
      "tr",
      { "data-model": model.name, "data-engine": model.engine, "data-state": model.state },
      element("td", { class: "name", text: model.name }),
      element("td", { text: model.engine }),
      element("td", { text: model.device }),
      element("td", { text: model.mode }),
      element("td", { class: "bytes", text: mib(model.resident_bytes) }),
      element("td", { class: "bytes", text: mib(model.streamed_bytes) }),
      element("td", { class: "bytes", text: mib(model.host_bytes) }),
      element(
        "td",
        {},
        element("span", { class: `badge state-${model.state}`, text: model.state }),
      ),
      element("td", { text: replicaText(model.replicas || []) }),
      element("td", {}, unload),
    );
  }

  // Unload one model by name, or every idle model (name null).
  async unload(name) {
    try {
      const result = await postJson("/runtime/unload", { model: name });
      const names = result.unloaded || [];
      this.onMessage(names.length ? `Unloaded ${names.join(", ")}.` : "Nothing was unloaded.");
    } catch (error) {
      this.onError(error);
    }
    await this.inFlight;
    await this.refresh();
  }
}
