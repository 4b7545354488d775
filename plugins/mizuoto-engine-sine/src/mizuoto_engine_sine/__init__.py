"""A tone-sequence engine for Mizuoto: each character a pitch, each word a streamed chunk."""
