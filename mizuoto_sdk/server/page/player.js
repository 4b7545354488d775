// Plays samples as they arrive: each piece is scheduled right where the last one ends, so the
// pieces join without gaps however the network splits them.

const START_LEAD_S = 0.08; // the first piece (and any after an underrun) starts this far ahead

export class StreamPlayer {
  constructor() {
    this.context = null;
    this.nextStart = 0;
    this.sources = new Set();
  }

  // Call from the click that starts a synthesis: browsers let a user gesture start audio.
  async begin() {
    if (!this.context) this.context = new AudioContext();
    if (this.context.state === "suspended") await this.context.resume();
    this.stop();
    this.nextStart = 0;
  }

  play(samples, sampleRate) {
    if (!samples.length || !this.context) return;
    const buffer = this.context.createBuffer(1, samples.length, sampleRate);
    buffer.copyToChannel(samples, 0);
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    const start = Math.max(this.nextStart, this.context.currentTime + START_LEAD_S);
    source.start(start);
    this.nextStart = start + buffer.duration;
    this.sources.add(source);
    source.onended = () => this.sources.delete(source);
  }

  stop() {
    for (const source of this.sources) source.stop();
    this.sources.clear();
  }
}
