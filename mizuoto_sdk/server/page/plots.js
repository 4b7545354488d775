// The waveform (drawn as samples arrive) and the spectrogram (computed once the audio is whole).

const BLOCK = 256; // samples per min/max pair of the waveform
const MIN_SPAN_S = 4; // the waveform's time axis starts this long and grows with the audio
const FFT_SIZE = 1024;
const FLOOR_DB = 80; // the spectrogram shows this many dB below its loudest bin

function fitCanvas(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = Math.round(canvas.clientWidth * ratio);
  const height = Math.round(canvas.clientHeight * ratio);
  if (canvas.width !== width || canvas.height !== height) {
    canvas.width = width;
    canvas.height = height;
  }
  return canvas.getContext("2d");
}

function cssColor(canvas, name) {
  return getComputedStyle(canvas).getPropertyValue(name).trim();
}

export class Waveform {
  constructor(canvas) {
    this.canvas = canvas;
    this.reset(null);
  }

  reset(sampleRate) {
    this.sampleRate = sampleRate;
    this.lows = [];
    this.highs = [];
    this.partial = { low: 0, high: 0, count: 0 };
    this.total = 0;
    this.final = false;
    this.draw();
  }

  add(samples, sampleRate) {
    this.sampleRate = sampleRate;
    const p = this.partial;
    for (const value of samples) {
      if (p.count === 0 || value < p.low) p.low = value;
      if (p.count === 0 || value > p.high) p.high = value;
      if (++p.count === BLOCK) {
        this.lows.push(p.low);
        this.highs.push(p.high);
        p.count = 0;
      }
    }
    this.total += samples.length;
    this.requestDraw();
  }

  finish() {
    const p = this.partial;
    if (p.count) {
      this.lows.push(p.low);
      this.highs.push(p.high);
      p.count = 0;
    }
    this.final = true;
    this.draw();
  }

  requestDraw() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = null;
      this.draw();
    });
  }

  draw() {
    const g = fitCanvas(this.canvas);
    const { width, height } = this.canvas;
    g.clearRect(0, 0, width, height);
    g.fillStyle = cssColor(this.canvas, "--axis");
    g.fillRect(0, Math.floor(height / 2), width, 1);
    const blocks = this.lows.length;
    if (!blocks) return;
    const minBlocks = this.final ? 0 : (MIN_SPAN_S * this.sampleRate) / BLOCK;
    const span = Math.max(blocks, minBlocks);
    g.fillStyle = cssColor(this.canvas, "--wave");
    const middle = height / 2;
    for (let x = 0; x < width; x++) {
      const first = Math.floor((x * span) / width);
      const last = Math.min(Math.ceil(((x + 1) * span) / width), blocks);
      if (first >= blocks) break;
      let low = 1;
      let high = -1;
      for (let b = first; b < Math.max(last, first + 1); b++) {
        low = Math.min(low, this.lows[b]);
        high = Math.max(high, this.highs[b]);
      }
      const top = middle - high * middle;
      g.fillRect(x, top, 1, Math.max(1, (high - low) * middle));
    }
  }
}

// In-place radix-2 FFT of real/imag arrays whose length is a power of two.
function fft(re, im) {
  const n = re.length;
  for (let i = 1, j = 0; i < n; i++) {
    let bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) {
      [re[i], re[j]] = [re[j], re[i]];
      [im[i], im[j]] = [im[j], im[i]];
    }
  }
  for (let size = 2; size <= n; size <<= 1) {
    const angle = (-2 * Math.PI) / size;
    const stepRe = Math.cos(angle);
    const stepIm = Math.sin(angle);
    for (let start = 0; start < n; start += size) {
      let wRe = 1;
      let wIm = 0;
      for (let k = 0; k < size / 2; k++) {
        const a = start + k;
        const b = a + size / 2;
        const tRe = re[b] * wRe - im[b] * wIm;
        const tIm = re[b] * wIm + im[b] * wRe;
        re[b] = re[a] - tRe;
        im[b] = im[a] - tIm;
        re[a] += tRe;
        im[a] += tIm;
        [wRe, wIm] = [wRe * stepRe - wIm * stepIm, wRe * stepIm + wIm * stepRe];
      }
    }
  }
}

// Dark blue -> purple -> orange -> pale yellow, as [position, r, g, b] stops.
const COLOURS = [
  [0.0, 8, 8, 32],
  [0.35, 90, 20, 110],
  [0.65, 220, 70, 50],
  [0.85, 250, 170, 40],
  [1.0, 252, 252, 190],
];

function colour(t) {
  for (let i = 1; i < COLOURS.length; i++) {
    const [end, ...high] = COLOURS[i];
    if (t <= end) {
      const [begin, ...low] = COLOURS[i - 1];
      const f = (t - begin) / (end - begin);
      return low.map((c, k) => Math.round(c + f * (high[k] - c)));
    }
  }
  return COLOURS[COLOURS.length - 1].slice(1);
}

const mel = (hz) => 2595 * Math.log10(1 + hz / 700);
const hertz = (m) => 700 * (10 ** (m / 2595) - 1);

// One column per canvas pixel (at most): the frames' log magnitudes on a mel frequency axis (as
// speech is heard: fine below 1 kHz, coarse above), low frequencies at the bottom.
export function drawSpectrogram(canvas, samples, sampleRate) {
  const g = fitCanvas(canvas);
  const { width, height } = canvas;
  g.clearRect(0, 0, width, height);
  if (samples.length < FFT_SIZE) return;
  const frames = Math.min(width, Math.floor((samples.length - FFT_SIZE) / 64) + 1);
  const hop = frames > 1 ? (samples.length - FFT_SIZE) / (frames - 1) : 0;
  const bins = FFT_SIZE / 2;
  const hann = Float32Array.from(
    { length: FFT_SIZE },
    (_, i) => 0.5 - 0.5 * Math.cos((2 * Math.PI * i) / (FFT_SIZE - 1)),
  );
  const decibels = new Float32Array(frames * bins);
  const re = new Float32Array(FFT_SIZE);
  const im = new Float32Array(FFT_SIZE);
  let loudest = -Infinity;
  for (let f = 0; f < frames; f++) {
    const offset = Math.round(f * hop);
    for (let i = 0; i < FFT_SIZE; i++) re[i] = samples[offset + i] * hann[i];
    im.fill(0);
    fft(re, im);
    for (let k = 0; k < bins; k++) {
      const db = 10 * Math.log10(re[k] * re[k] + im[k] * im[k] + 1e-12);
      decibels[f * bins + k] = db;
      loudest = Math.max(loudest, db);
    }
  }
  const image = g.createImageData(frames, height);
  const top = mel(sampleRate / 2);
  for (let y = 0; y < height; y++) {
    const hz = hertz(((height - 1 - y) / height) * top);
    const k = Math.min(bins - 1, Math.round((hz * FFT_SIZE) / sampleRate));
    for (let f = 0; f < frames; f++) {
      const t = Math.max(0, 1 + (decibels[f * bins + k] - loudest) / FLOOR_DB);
      const [r, gr, b] = colour(t);
      const at = (y * frames + f) * 4;
      image.data.set([r, gr, b, 255], at);
    }
  }
  // Stretch the frames across the whole width.
  const bitmap = document.createElement("canvas");
  bitmap.width = frames;
  bitmap.height = height;
  bitmap.getContext("2d").putImageData(image, 0, 0);
  g.imageSmoothingEnabled = false;
  g.drawImage(bitmap, 0, 0, width, height);
}
