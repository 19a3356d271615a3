"""The front with the real SmolLM2 tokenizer: the GGUF's own chat template is applied and
streamed text never splits a UTF-8 character. The engine is still the FAKE one (this is
the front's test); only the tokenizer is the model's."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from swactor.model.paths import default_model_path
from swactor.model.tokenizer import Tokenizer
from tests.serve.fake_engine import FakeEngine, ServerThread

# Needs the real model file: grouped with the other real-model tests.
pytestmark = pytest.mark.slow

REPLY = " Paris. Café 🤗"


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(default_model_path())


@pytest.fixture
def served(tokenizer: Tokenizer) -> Iterator[tuple[FakeEngine, openai.OpenAI]]:
    engine = FakeEngine(real_tokenizer=tokenizer,
                        reply_ids=tokenizer.encode(REPLY, add_bos=False))
    thread = ServerThread(engine)
    yield engine, openai.OpenAI(base_url=thread.url + "/v1", api_key="unused", max_retries=0,
                                timeout=10)
    thread.close()


def test_chat_uses_the_gguf_template(served: tuple[FakeEngine, openai.OpenAI],
                                     tokenizer: Tokenizer) -> None:
    engine, client = served
    result = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Capital of France?"}])
    assert result.choices[0].message.content == REPLY
    # SmolLM2's template adds its default system turn when none is given.
    assert tokenizer.decode(engine.submitted[0].prompt) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_stream_never_splits_a_character(served: tuple[FakeEngine, openai.OpenAI]) -> None:
    engine, client = served
    assert engine.reply_ids is not None
    chunks = list(client.completions.create(model="m", prompt="Where?", max_tokens=50,
                                            stream=True))
    texts = [c.choices[0].text for c in chunks]
    assert "".join(texts) == REPLY
    assert all("\ufffd" not in t for t in texts)
    # the emoji spans several byte-level tokens: fewer text chunks than tokens
    assert len([t for t in texts if t]) < len(engine.reply_ids)
