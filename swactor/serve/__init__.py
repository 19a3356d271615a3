"""``swactor serve``'s HTTP front: an OpenAI-compatible API over a warm pipeline.

The front (:class:`~swactor.serve.server.ServeFront`, aiohttp) answers
``POST /v1/completions``, ``POST /v1/chat/completions`` (both also as server-sent events),
``GET /v1/models``, ``GET /health`` and ``GET /metrics``. It owns HTTP and text; the
pipeline behind it is an :class:`~swactor.serve.engine.Engine`, which owns sequences.

What the front guarantees the engine:

* every prompt it submits is non-empty, made of ids below ``tokenizer.vocab_size``, and
  ``len(prompt) + params.max_tokens <= context_length``;
* at most ``slots`` sequences are submitted and not yet finished at any time (the front
  queues the rest, bounded, and answers 429 past the bound), so the engine needs no queue
  of its own except while a run is being provisioned or recovered;
* it calls ``cancel(sequence_id)`` whenever it stops reading a sequence before its
  :class:`~swactor.serve.engine.Finished` event (client gone, stop string matched); it
  may then drop the stream without reading it further;
* it calls ``health()`` on every request and ``/metrics`` scrape, from its event loop.

What the engine must guarantee the front:

* ``submit`` returns at once (no blocking work in the caller's event loop) and never
  raises: a sequence it cannot run yields ``Finished(ERROR, detail)``;
* a stream yields zero or more ``Tokens`` events (one id, or a group of ids when the
  pipeline produced several at once), optionally one ``Started`` first, and ends with
  exactly one ``Finished``; ``Tokens`` never contain the end-of-generation id that ended
  the sequence (``Finished(STOP)``), and at most ``params.max_tokens`` ids come before
  ``Finished(LENGTH)``;
* a stream never hangs: a stage fault, a worker death, the run being torn down or the
  session stopping ends every in-flight stream with ``Finished(ERROR, detail)`` where
  ``detail`` names the fault in words a client may read (no payload, no traceback);
* ``cancel`` is synchronous, idempotent and cheap, accepts ids already finished or
  unknown, and frees the sequence's slot at once (an in-flight stream then ends with
  ``Finished(CANCELLED)``); the front never waits for that event;
* sampling follows ``SamplingParams``: greedy at ``temperature == 0``, otherwise
  temperature/top-p with a generator seeded by ``seed`` (spec §10's ``sample_token``),
  so equal params give equal output;
* ``health()`` is cheap and says the serving session's state; ``Health.restarts``
  counts runs provisioned again after a fault (a counter: it never goes down);
* ``tokenizer`` is the model's own (:class:`swactor.model.tokenizer.Tokenizer` fits
  :class:`~swactor.serve.engine.TextCodec`): the front renders the GGUF's chat template
  and encodes prompts with it, and decodes the ids the engine yields.
"""
