"""Text for speech models, without torch: tokenizers as the Hub ships them, normalisation, sentences."""
