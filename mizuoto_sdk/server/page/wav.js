// A streamed 16-bit PCM WAV read as it arrives, and the finished WAV written back out.
//
// The server sends the RIFF and data sizes as 0xFFFFFFFF while the length is unknown, so the
// reader never trusts them: the data runs to the end of the stream.

const UNKNOWN_SIZE = 0xffffffff;
const HEADER_BYTES = 44;

export class WavError extends Error {}

function text(view, offset) {
  return String.fromCharCode(
    view.getUint8(offset),
    view.getUint8(offset + 1),
    view.getUint8(offset + 2),
    view.getUint8(offset + 3),
  );
}

function concat(a, b) {
  const joined = new Uint8Array(a.length + b.length);
  joined.set(a, 0);
  joined.set(b, a.length);
  return joined;
}

// The header's facts, or null while too few bytes have come to know where the data starts.
function parseHeader(bytes) {
  if (bytes.length < 12) return null;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (text(view, 0) !== "RIFF" || text(view, 8) !== "WAVE") {
    throw new WavError("the response is not a WAV file (no RIFF/WAVE header)");
  }
  let offset = 12;
  let format = null;
  while (offset + 8 <= bytes.length) {
    const id = text(view, offset);
    const size = view.getUint32(offset + 4, true);
    const body = offset + 8;
    if (id === "data") {
      if (!format) throw new WavError("the WAV data chunk comes before its fmt chunk");
      return { ...format, dataOffset: body, dataSize: size === UNKNOWN_SIZE ? null : size };
    }
    if (body + size > bytes.length) return null;
    if (id === "fmt ") {
      format = {
        encoding: view.getUint16(body, true),
        channels: view.getUint16(body + 2, true),
        sampleRate: view.getUint32(body + 4, true),
        bitsPerSample: view.getUint16(body + 14, true),
      };
      if (format.encoding !== 1 || format.bitsPerSample !== 16 || format.channels !== 1) {
        throw new WavError(
          `expected 16-bit PCM mono, got encoding ${format.encoding}, ` +
            `${format.bitsPerSample} bits, ${format.channels} channels`,
        );
      }
    }
    offset = body + size + (size % 2);
  }
  return null;
}

// Feed it the body's bytes as they come; each call returns the new samples as Float32 in [-1, 1).
export class WavStreamReader {
  constructor() {
    this.header = null;
    this.pending = new Uint8Array(0); // header bytes not yet parsed, or one odd PCM byte
    this.pieces = []; // every Int16Array received, for the finished file
    this.sampleCount = 0;
  }

  get sampleRate() {
    return this.header ? this.header.sampleRate : null;
  }

  push(chunk) {
    let bytes = this.pending.length ? concat(this.pending, chunk) : chunk;
    if (!this.header) {
      this.header = parseHeader(bytes);
      if (!this.header) {
        this.pending = bytes;
        return new Float32Array(0);
      }
      bytes = bytes.subarray(this.header.dataOffset);
    }
    const even = bytes.length - (bytes.length % 2);
    this.pending = bytes.slice(even);
    // Copy to an aligned buffer: an Int16Array view needs an even byte offset.
    const pcm = new Int16Array(bytes.slice(0, even).buffer);
    const samples = new Float32Array(pcm.length);
    for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
    if (pcm.length) {
      this.pieces.push(pcm);
      this.sampleCount += pcm.length;
    }
    return samples;
  }

  // Every sample so far as one Float32Array (for the spectrogram).
  samples() {
    const all = new Float32Array(this.sampleCount);
    let at = 0;
    for (const piece of this.pieces) {
      for (let i = 0; i < piece.length; i++) all[at + i] = piece[i] / 32768;
      at += piece.length;
    }
    return all;
  }

  // The received audio as a complete WAV file, its sizes filled in.
  toBlob() {
    const rate = this.sampleRate ?? 0;
    const dataBytes = this.sampleCount * 2;
    const header = new DataView(new ArrayBuffer(HEADER_BYTES));
    const ascii = (offset, word) => {
      for (let i = 0; i < 4; i++) header.setUint8(offset + i, word.charCodeAt(i));
    };
    ascii(0, "RIFF");
    header.setUint32(4, 36 + dataBytes, true);
    ascii(8, "WAVE");
    ascii(12, "fmt ");
    header.setUint32(16, 16, true);
    header.setUint16(20, 1, true); // PCM
    header.setUint16(22, 1, true); // mono
    header.setUint32(24, rate, true);
    header.setUint32(28, rate * 2, true); // bytes per second
    header.setUint16(32, 2, true); // bytes per frame
    header.setUint16(34, 16, true);
    ascii(36, "data");
    header.setUint32(40, dataBytes, true);
    return new Blob([header.buffer, ...this.pieces], { type: "audio/wav" });
  }
}
