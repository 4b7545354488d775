// The page: pick an engine, synthesize (or convert or edit a WAV file), hear it while it
// streams, see what is loaded.
//
// State for tests and scripts, without reading internals: the form's data-state (idle,
// streaming, done, stopped, error) and window.mizuotoPage (the last synthesis's figures).

import { ApiError, getJson, synthesize, upload } from "./api.js";
import { renderChoices, renderEngines, renderParams, unavailableReason } from "./form.js";
import { StreamPlayer } from "./player.js";
import { drawSpectrogram, Waveform } from "./plots.js";
import { RuntimePanel } from "./runtime.js";
import { WavError, WavStreamReader } from "./wav.js";

const $ = (selector) => document.querySelector(selector);

const form = $("#synthesis");
const errorBox = $("#error");
const statusLine = $("#status");
const audio = $("#audio");
const download = $("#download");
const synthButton = $("#synthesize");
const stopButton = $("#stop");
const capabilitySelect = $("#capability");
const TASKS = ["synthesize", "convert", "edit"];
const waveform = new Waveform($("#waveform"));
const player = new StreamPlayer();

const page = {
  state: "idle",
  engine: null,
  firstAudioMs: null,
  totalMs: null,
  sampleRate: null,
  sampleCount: 0,
  model: null, // the server's name of the model that answered
  engineFirstChunkS: null, // the engine's own time to its first chunk, as the server measured it
  error: null,
};
window.mizuotoPage = page;

let readParams = () => ({});
let controller = null;
let audioUrl = null;

function setState(state) {
  page.state = state;
  form.dataset.state = state;
  synthButton.disabled = state === "streaming" || !page.engine;
  stopButton.disabled = state !== "streaming";
}

function showError(error) {
  const api = error instanceof ApiError ? error : new ApiError("client_error", errorText(error));
  page.error = { code: api.code, message: api.message, detail: api.detail };
  errorBox.hidden = false;
  errorBox.querySelector(".code").textContent = api.code;
  errorBox.querySelector(".message").textContent = api.message;
  const detail = Object.keys(api.detail || {}).length ? JSON.stringify(api.detail, null, 2) : "";
  errorBox.querySelector(".detail").textContent = detail;
  errorBox.querySelector(".detail").hidden = !detail;
}

function errorText(error) {
  return String(error.message || error);
}

function clearError() {
  page.error = null;
  errorBox.hidden = true;
}

function seconds(ms) {
  return ms === null ? "–" : `${(ms / 1000).toFixed(2)} s`;
}

function showStatus(prefix = "") {
  const duration = page.sampleRate ? page.sampleCount / page.sampleRate : 0;
  const engineS = page.engineFirstChunkS;
  const engine = engineS === null ? "" : ` (engine ${engineS.toFixed(2)} s)`;
  const parts = [
    `first audio ${seconds(page.firstAudioMs)}${engine}`,
    `total ${seconds(page.totalMs)}`,
    `audio ${duration.toFixed(2)} s`,
  ];
  if (page.sampleRate) parts.push(`${page.sampleRate} Hz`);
  statusLine.textContent = (prefix ? `${prefix}: ` : "") + parts.join(" · ");
}

function chooseEngine(engine) {
  page.engine = engine;
  $("#engine-title").textContent = `${engine.name} (${engine.id})`;
  readParams = renderParams($("#params"), engine);
  renderChoices($("#model"), engine.models, "(default)");
  renderChoices($("#device"), engine.devices, "(host's choice)");
  capabilitySelect.replaceChildren();
  for (const task of TASKS.filter((name) => (engine.capabilities || []).includes(name))) {
    capabilitySelect.append(new Option(task, task));
  }
  showTask();
  setState(page.state === "streaming" ? "streaming" : "idle");
}

// The inputs of the chosen task: text to synthesize, audio to convert, both to edit.
function showTask() {
  const task = capabilitySelect.value || "synthesize";
  $("#audio-in").hidden = task === "synthesize";
  $("#text-in").hidden = task === "convert";
  synthButton.textContent = task[0].toUpperCase() + task.slice(1);
}

// The chosen task's request, answered as a streamed WAV Response.
function send(signal) {
  const task = capabilitySelect.value || "synthesize";
  if (task === "synthesize") return synthesize(request(), signal);
  const file = $("#input-audio").files[0];
  if (!file) {
    throw new ApiError("invalid_request", "audio: choose a WAV file to " + task, {
      field: "audio",
    });
  }
  const { text, ...rest } = request();
  return upload(task, task === "edit" ? { ...rest, text } : rest, file, signal);
}

function request() {
  const seedText = $("#seed").value.trim();
  return {
    engine: page.engine.id,
    text: $("#text").value,
    params: readParams(),
    seed: seedText === "" ? null : Number.parseInt(seedText, 10),
    model: $("#model").value || null,
    device: $("#device").value || null,
  };
}

// The finished (or stopped) audio: into the <audio> element and the spectrogram.
function finishAudio(reader) {
  waveform.finish();
  if (audioUrl) URL.revokeObjectURL(audioUrl);
  if (!reader.sampleCount) return;
  audioUrl = URL.createObjectURL(reader.toBlob());
  audio.src = audioUrl;
  download.href = audioUrl;
  download.download = `${page.engine.id}.wav`;
  download.hidden = false;
  drawSpectrogram($("#spectrogram"), reader.samples(), reader.sampleRate);
}

async function run(event) {
  event.preventDefault();
  if (!page.engine || page.state === "streaming") return;
  clearError();
  Object.assign(page, {
    firstAudioMs: null,
    totalMs: null,
    sampleRate: null,
    sampleCount: 0,
    model: null,
    requestId: null,
    engineFirstChunkS: null,
  });
  download.hidden = true;
  audio.removeAttribute("src");
  audio.load();
  waveform.reset(null);
  drawSpectrogram($("#spectrogram"), new Float32Array(0), 1);
  setState("streaming");
  showStatus("waiting");
  const started = performance.now();
  controller = new AbortController();
  const reader = new WavStreamReader();
  let responded = false;
  try {
    await player.begin();
    const response = await send(controller.signal);
    responded = true;
    page.model = response.headers.get("X-Mizuoto-Model");
    page.requestId = response.headers.get("X-Mizuoto-Request");
    const firstChunk = Number.parseFloat(response.headers.get("X-Mizuoto-First-Chunk"));
    page.engineFirstChunkS = Number.isFinite(firstChunk) ? firstChunk : null;
    const body = response.body.getReader();
    for (;;) {
      const { done, value } = await body.read();
      if (done) break;
      const samples = reader.push(value);
      if (!samples.length) continue;
      page.firstAudioMs ??= performance.now() - started;
      page.sampleRate = reader.sampleRate;
      page.sampleCount = reader.sampleCount;
      player.play(samples, reader.sampleRate);
      waveform.add(samples, reader.sampleRate);
      showStatus("streaming");
    }
    if (!reader.header) throw new WavError("the stream ended before its WAV header");
    page.totalMs = performance.now() - started;
    finishAudio(reader);
    setState("done");
    showStatus("done");
  } catch (error) {
    page.totalMs = performance.now() - started;
    finishAudio(reader);
    if (error.name === "AbortError") {
      setState("stopped");
      showStatus("stopped");
    } else {
      player.stop();
      showError(await streamError(error, responded, reader));
      setState("error");
      showStatus("failed");
    }
  } finally {
    controller = null;
    runtimePanel.refresh();
  }
}

// An error while reading: the API's own, or a stream the server cut after it had begun. A cut
// stream carries no error body (and the browser may drop the audio it had not yet handed over):
// the server keeps how the request ended under its X-Mizuoto-Request id.
async function streamError(error, responded, reader) {
  if (error instanceof ApiError) return error;
  if (error instanceof WavError) return new ApiError("invalid_audio", error.message);
  if (!responded) return new ApiError("network_error", errorText(error));
  const received = { samples_received: reader.sampleCount };
  try {
    const outcome = await getJson(`/requests/${encodeURIComponent(page.requestId)}`);
    if (outcome.error) {
      const { code, message, detail } = outcome.error;
      return new ApiError(code, `The stream was cut: ${message}`, { ...detail, ...received });
    }
  } catch {
    // the server does not know the request any more: say what the page saw
  }
  return new ApiError(
    "stream_interrupted",
    "The audio stream ended early: the server failed after it had begun (its log says why).",
    received,
  );
}

function stop() {
  if (controller) controller.abort();
  player.stop();
}

async function loadEngines() {
  const list = $("#engines");
  try {
    const engines = await getJson("/engines");
    renderEngines(list, engines, chooseEngine);
    const first = engines.find((engine) => !unavailableReason(engine));
    if (first) {
      list.querySelector(`input[value="${CSS.escape(first.id)}"]`).checked = true;
      chooseEngine(first);
    }
    list.dataset.state = "loaded";
  } catch (error) {
    list.dataset.state = "error";
    showError(error);
  }
}

async function loadHealth() {
  try {
    const health = await getJson("/health");
    $("#server").textContent = `server ${health.version} · pid ${health.pid}`;
  } catch (error) {
    showError(error);
  }
}

const runtimePanel = new RuntimePanel($("#runtime"), {
  onError: showError,
  onMessage: (text) => {
    $("#runtime-message").textContent = text;
  },
});

form.addEventListener("submit", run);
capabilitySelect.addEventListener("change", showTask);
stopButton.addEventListener("click", stop);
errorBox.querySelector(".dismiss").addEventListener("click", clearError);
setState("idle");
loadHealth();
loadEngines();
runtimePanel.start();
