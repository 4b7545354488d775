"""Engine ``fetched``, whose models come from URLs, a Hugging Face Hub repository and a package.

The URLs point at ``MIZUOTO_FIXTURE_MODELS_URL`` (a test's loopback server), read when the hook
runs; ``FILES`` is what every source serves, so the tests can serve the same bytes.
"""

import hashlib

FILES = {
    "weights.bin": bytes(range(256)) * 512,  # 128 KiB: big enough to stop half way
    "config/model.json": b'{"layers": 2}\n',
}
HUB_REPO = "mizuoto/fixture-tiny"
HUB_REVISION = "0123456789abcdef0123456789abcdef01234567"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
