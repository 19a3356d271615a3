"""Where swactor keeps model files.

Theory of operation: the embedded model (SmolLM2-135M-Instruct, Q4_1) is unpacked by
``scripts/setup.sh`` into a cache folder, ``$SWACTOR_MODEL_CACHE`` when set, else
``~/.cache/swactor/models``. Commands that take ``--model`` default to
:func:`default_model_path` and parse the flag with :func:`model_location` (a local path,
or an http(s) URL kept as text); nothing here checks that the file exists — the reader
that opens it reports a missing file with a typed error.
"""

from __future__ import annotations

import os
from pathlib import Path

MODEL_CACHE_ENV = "SWACTOR_MODEL_CACHE"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_cache_dir() -> Path:
    """The model cache folder: ``$SWACTOR_MODEL_CACHE`` or ``~/.cache/swactor/models``."""
    configured = os.environ.get(MODEL_CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "swactor" / "models"


def default_model_path() -> Path:
    """The embedded model's path inside the cache folder."""
    return model_cache_dir() / DEFAULT_MODEL_FILE


def model_location(text: str) -> Path | str:
    """A ``--model`` value: an http(s) URL as given (a str), else a local path."""
    if text.startswith(("http://", "https://")):
        return text
    return Path(text)
