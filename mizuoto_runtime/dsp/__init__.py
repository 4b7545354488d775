"""Signal processing equal to the packages real models were trained with (librosa, Whisper, HiFi-GAN, Kaldi)."""
