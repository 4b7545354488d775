"""``mizuoto_runtime.dsp`` against the upstream each function equals, in one run.

Rows: Whisper's log-mel (against ``whisper.audio.log_mel_spectrogram``), HiFi-GAN's mel (against
upstream's ``meldataset.mel_spectrogram``, written out below as published), Kaldi's fbank (against
``kaldi_native_fbank.OnlineFbank``, through its Python API as callers use it) and librosa's
melspectrogram (against ``librosa.feature.melspectrogram``); then ``benchmarks/tokenizer.py``'s
encode throughput of ``text.Tokenizer`` against transformers' fast tokenizer. Each runs on the
same noise; ours and upstream's calls alternate, so both meet the same machine load, and the
best of ``--repeats`` is printed as milliseconds per second of audio, with ours / upstream. The
peers are test extras:

    pip install librosa openai-whisper kaldi-native-fbank
    python benchmarks/dsp.py [--seconds 10] [--repeats 20] [--device cpu|cuda]

On ``--device cuda`` ours and the torch peers (Whisper, HiFi-GAN) run on the GPU, synchronised
before each clock read; kaldi-native-fbank and librosa stay on the CPU.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import torch
from _timing import alternating_best  # benchmarks/ is on sys.path when run as a script

from mizuoto_runtime.dsp import hifigan_mel, kaldi_fbank, melspectrogram, whisper_log_mel


def hifigan_reference() -> Callable[..., torch.Tensor]:
    """HiFi-GAN's ``mel_spectrogram`` as BigVGAN publishes it (torch 2's return_complex)."""
    from librosa.filters import mel as librosa_mel_fn

    mel_basis_cache: dict[str, torch.Tensor] = {}
    hann_window_cache: dict[str, torch.Tensor] = {}

    def mel_spectrogram(
        y, n_fft, num_mels, sampling_rate, hop_size, win_size, fmin, fmax, center=False
    ):
        device = y.device
        key = f"{n_fft}_{num_mels}_{sampling_rate}_{hop_size}_{win_size}_{fmin}_{fmax}_{device}"
        if key not in mel_basis_cache:
            mel = librosa_mel_fn(
                sr=sampling_rate, n_fft=n_fft, n_mels=num_mels, fmin=fmin, fmax=fmax
            )
            mel_basis_cache[key] = torch.from_numpy(mel).float().to(device)
            hann_window_cache[key] = torch.hann_window(win_size).to(device)
        padding = (n_fft - hop_size) // 2
        y = torch.nn.functional.pad(y.unsqueeze(1), (padding, padding), mode="reflect").squeeze(1)
        spec = torch.stft(
            y,
            n_fft,
            hop_length=hop_size,
            win_length=win_size,
            window=hann_window_cache[key],
            center=center,
            pad_mode="reflect",
            normalized=False,
            onesided=True,
            return_complex=True,
        )
        spec = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
        return torch.log(torch.clamp(torch.matmul(mel_basis_cache[key], spec), min=1e-5) * 1)

    return mel_spectrogram


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--no-tokenizer", action="store_true", help="leave out benchmarks/tokenizer.py's rows"
    )
    args = parser.parse_args()
    try:
        import kaldi_native_fbank as knf
        import librosa
        import whisper.audio
    except ImportError:
        raise SystemExit(
            "this benchmark compares against librosa, openai-whisper and kaldi-native-fbank: "
            "pip install librosa openai-whisper kaldi-native-fbank"
        ) from None
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rng = np.random.default_rng(0)

    def noise(rate: int) -> np.ndarray:
        return rng.uniform(-1, 1, int(rate * args.seconds)).astype(np.float32)

    rows: list[tuple[str, Callable[[], object], Callable[[], object]]] = []
    speech = noise(16_000)
    on_device = torch.from_numpy(speech).to(device)
    rows.append(
        (
            f"Whisper log-mel 80 ({device.type})",
            lambda: whisper_log_mel(on_device),
            lambda: whisper.audio.log_mel_spectrogram(on_device),
        )
    )
    vocoder = torch.from_numpy(noise(22_050))[None].to(device)
    config = dict(
        n_fft=1024,
        num_mels=80,
        sampling_rate=22_050,
        hop_size=256,
        win_size=1024,
        fmin=0,
        fmax=8000,
    )
    reference = hifigan_reference()
    rows.append(
        (
            f"HiFi-GAN mel 22.05k ({device.type})",
            lambda: hifigan_mel(vocoder, **config),  # type: ignore[arg-type]
            lambda: reference(vocoder, **config),
        )
    )

    def knf_fbank() -> np.ndarray:
        options = knf.FbankOptions()
        options.frame_opts.dither = 0.0
        options.mel_opts.num_bins = 80
        fbank = knf.OnlineFbank(options)
        fbank.accept_waveform(16_000, speech.tolist())
        fbank.input_finished()
        return np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)])

    rows.append(
        (
            f"Kaldi fbank 80 ({device.type} vs knf cpu)",
            lambda: kaldi_fbank(on_device),
            knf_fbank,
        )
    )
    music = noise(22_050)
    settings = dict(sr=22_050, n_fft=2048, hop_length=512, n_mels=128)
    rows.append(
        (
            "librosa melspectrogram 128 (cpu)",
            lambda: melspectrogram(music, **settings),  # type: ignore[arg-type]
            lambda: librosa.feature.melspectrogram(y=music, **settings),
        )
    )

    print(f"{args.seconds:g} s of audio, best of {args.repeats}, ms per second of audio")
    print(f"{'':<40} {'ours':>8} {'upstream':>9} {'ours/upstream':>14}")
    for name, ours, theirs in rows:
        mine, peer = alternating_best(ours, theirs, args.repeats, sync)
        per = 1e3 / args.seconds
        print(f"{name:<40} {mine * per:>8.3f} {peer * per:>9.3f} {mine / peer:>13.2f}x")

    if not args.no_tokenizer:  # text.Tokenizer against transformers' fast tokenizer
        import tokenizer

        print()
        tokenizer.main(["--megabytes", "1", "--repeats", "3"])


if __name__ == "__main__":
    main()
