"""HiFi-GAN, DAC, Vocos and BigVGAN (``mizuoto_runtime.nn``) against their upstreams in one run.

Each family's published architecture (``SpeechT5HifiGanConfig()``: 80 mels, 512 channels, hop 256;
``DacConfig()``: the 16 kHz DAC, hop 512, decoder 1536 wide; ``charactr/vocos-mel-24khz``: 100
mels, dim 512, 8 ConvNeXt layers, ISTFT 1024 / 256 centred; BigVGAN ``bigvgan_base_24khz_100band``:
512 channels, rates 8-8-2-2, AMPBlock1, snakebeta), randomly initialised, is written to a
temporary folder as the Hub ships it; both sides load it. Rows: HiFi-GAN vocoding a mel, DAC
encoding noise to codes, DAC decoding codes to audio, Vocos and BigVGAN vocoding a mel. The peer is
transformers for the first three; Vocos and BigVGAN have no transformers class (and their packages
need torchaudio / are not on PyPI), so their peer is the re-derived upstream forward of
``benchmarks/_ref_vocoders.py`` (the tests' oracle), BigVGAN's weight norm removed first as
upstream's ``inference.py`` does. Calls alternate, so both meet the same machine load; the best of
``--repeats`` is printed as seconds of audio per second of compute, with ours / theirs (above 1.0x
we are faster). ``same`` says whether the outputs were bitwise equal.

Peak memory: on the CPU, the peak resident set of a fresh process that loads the folder and runs
the row once, less its resident set after the imports (weights touched plus working memory); on
CUDA, ``torch.cuda.max_memory_allocated`` over one call after loading, less what was allocated
before it (working memory only).

    python benchmarks/nn_vocoders.py [--rows hifigan dac-encode dac-decode vocos bigvgan]
        [--seconds 4]
        [--repeats 5] [--device cpu|cuda] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import _ref_vocoders as ref  # benchmarks/ is on sys.path when this runs as a script
import torch
from _timing import alternating_best, status_mib  # benchmarks/ is on sys.path when run as a script

ROWS = ("hifigan", "dac-encode", "dac-decode", "vocos", "bigvgan")
VOCOS = {"n_mels": 100, "dim": 512, "intermediate_dim": 1536, "num_layers": 8}
VOCOS_TRANSFORMS = {"n_fft": 1024, "hop_length": 256, "sample_rate": 24000}
BIGVGAN = {
    "upsample_rates": [8, 8, 2, 2],
    "upsample_kernel_sizes": [16, 16, 4, 4],
    "upsample_initial_channel": 512,
    "resblock_kernel_sizes": [3, 7, 11],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "num_mels": 100,
    "hop_size": 256,
    "sampling_rate": 24000,
}


def save_checkpoint(folder: Path, family: str) -> Path:
    from transformers import DacConfig, DacModel, SpeechT5HifiGan, SpeechT5HifiGanConfig

    if family == "vocos":  # the reference seeds inside fork_rng itself
        return ref.save_vocos(ref.make_vocos(ref.vocos_config(**VOCOS, **VOCOS_TRANSFORMS)), folder)
    if family == "bigvgan":
        return ref.save_bigvgan(ref.make_bigvgan(ref.bigvgan_config(**BIGVGAN)), folder)

    with torch.random.fork_rng():
        torch.manual_seed(0)  # allowed: a script of its own, inside fork_rng
        if family == "hifigan":
            SpeechT5HifiGan(SpeechT5HifiGanConfig()).save_pretrained(folder)
        else:
            DacModel(DacConfig()).save_pretrained(folder)
    return folder


def family_of(row: str) -> str:
    return "dac" if row.startswith("dac") else row


def load(side: str, row: str, folder: Path, device: str, dtype: torch.dtype) -> Callable:
    """The row's function of its input, for ``side`` ``ours`` or ``transformers``."""
    if side == "ours":
        from mizuoto_runtime.nn import load_codec, load_vocoder

        if not row.startswith("dac"):
            return load_vocoder(folder, device=device, dtype=dtype)
        codec = load_codec(folder, device=device, dtype=dtype)
        return codec.encode if row == "dac-encode" else lambda c: codec.decode(c)[:, 0]
    if row == "vocos":
        return ref.load_vocos(folder).to(device, dtype).decode
    if row == "bigvgan":
        model = ref.remove_weight_norm(ref.load_bigvgan(folder)).to(device, dtype)
        return lambda mel: model(mel)[:, 0]
    from transformers import DacModel, SpeechT5HifiGan

    if row == "hifigan":
        return SpeechT5HifiGan.from_pretrained(folder, dtype=dtype).to(device).eval()
    model = DacModel.from_pretrained(folder, dtype=dtype).to(device).eval()
    if row == "dac-encode":
        return lambda audio: model.encode(audio).audio_codes
    return lambda codes: model.decode(audio_codes=codes).audio_values


def make_input(row: str, seconds: float, device: str, dtype: torch.dtype) -> torch.Tensor:
    """A mel (hop 256 at 16 kHz; channels first, hop 256 at 24 kHz for Vocos and BigVGAN), noise
    ``[1, 1, T]``, or codes (hop 512) for ``seconds``."""
    generator = torch.Generator().manual_seed(1)
    if row in ("vocos", "bigvgan"):
        mel = torch.randn(1, 100, round(seconds * 24_000 / 256), generator=generator)
        return mel.to(device, dtype)
    if row == "hifigan":
        mel = torch.randn(1, round(seconds * 16_000 / 256), 80, generator=generator)
        return mel.to(device, dtype)
    if row == "dac-encode":
        return (0.1 * torch.randn(1, 1, round(seconds * 16_000), generator=generator)).to(
            device, dtype
        )
    return torch.randint(0, 1024, (1, 9, round(seconds * 16_000 / 512)), generator=generator).to(
        device
    )


def peak_child(side: str, row: str, folder: str, seconds: float, dtype_name: str) -> None:
    """Run in a fresh process: print the peak MiB above the post-import resident set."""
    import transformers.models.dac.modeling_dac
    import transformers.models.speecht5.modeling_speecht5  # noqa: F401

    import mizuoto_runtime.nn.bigvgan
    import mizuoto_runtime.nn.dac
    import mizuoto_runtime.nn.hifigan
    import mizuoto_runtime.nn.vocos  # noqa: F401

    dtype = getattr(torch, dtype_name)
    data = make_input(row, seconds, "cpu", dtype)
    baseline = status_mib("VmRSS")
    function = load(side, row, Path(folder), "cpu", dtype)
    with torch.inference_mode():
        function(data)
    print(status_mib("VmHWM") - baseline)


def peak_mib(side: str, row: str, folder: Path, args: argparse.Namespace) -> float:
    if args.device == "cpu":
        command = [sys.executable, __file__, "--peak-child", side, row, str(folder)]
        command += [str(args.seconds), args.dtype]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        return float(result.stdout.strip().splitlines()[-1])
    dtype = getattr(torch, args.dtype)
    function = load(side, row, folder, args.device, dtype)
    data = make_input(row, args.seconds, args.device, dtype)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    with torch.inference_mode():
        function(data)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - start) / 2**20


def compare(
    row: str, folder: Path, args: argparse.Namespace, sync: Callable[[], None]
) -> tuple[float, float, list[float], bool]:
    """Best seconds of ours and of transformers, both peaks in MiB, and whether all bits agree."""
    dtype = getattr(torch, args.dtype)
    ours = load("ours", row, folder, args.device, dtype)
    theirs = load("transformers", row, folder, args.device, dtype)
    data = make_input(row, args.seconds, args.device, dtype)
    with torch.inference_mode():
        same = torch.equal(ours(data), theirs(data))
        mine, peer = alternating_best(lambda: ours(data), lambda: theirs(data), args.repeats, sync)
    memory = [peak_mib(side, row, folder, args) for side in ("ours", "transformers")]
    return mine, peer, memory, same


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--peak-child":
        side, row, folder, seconds, dtype = sys.argv[2:7]
        peak_child(side, row, folder, float(seconds), dtype)
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    print(
        f"{args.seconds:g} s of audio, batch 1, {args.dtype} on {args.device}, "
        f"{torch.get_num_threads()} threads, best of {args.repeats}"
    )
    header = f"{'row':<11} {'ours s/s':>9} {'theirs s/s':>10} {'ratio':>6}"
    print(f"{header} {'ours MiB':>9} {'theirs MiB':>10}  same")
    with tempfile.TemporaryDirectory() as root:
        folders: dict[str, Path] = {}
        for row in args.rows:
            family = family_of(row)
            if family not in folders:
                folders[family] = save_checkpoint(Path(root) / family, family)
            mine, peer, (our_mib, their_mib), same = compare(row, folders[family], args, sync)
            print(
                f"{row:<11} {args.seconds / mine:>9.2f} {args.seconds / peer:>10.2f} "
                f"{peer / mine:>5.2f}x {our_mib:>9.1f} {their_mib:>10.1f}  {same}"
            )


if __name__ == "__main__":
    main()
