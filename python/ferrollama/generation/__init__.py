"""Generation: from logits to tokens and text, over the core (``Model``, ``Context``, ``Batch``).

The layer above ``_core`` and below chat and the faces (``Llama``, the server, ``batch``): no
HTTP, no llama-cpp-python shapes. Its modules:

- ``params``: :class:`SamplingParams` (llama.cpp's common_params_sampling), seeds, sampler names;
- ``sampler``: :class:`Sampler`, llama.cpp's common_sampler chain with its grammar;
- ``text``: :class:`Utf8Stream`, :class:`StopScanner`, :func:`decode_tokens` (pieces to text);
- ``tokens``: :func:`add_bos_of`, :func:`common_prefix_len`;
- ``logprobs``: log-probabilities of sampled tokens in OpenAI's completion and chat shapes;
- ``scheduler``: :class:`Scheduler`, continuous batching of requests over one Context;
- ``speculative``: prompt lookup and draft models, verified in one batch;
- ``media``: images loaded as libmtmd's stb_image decodes them, preprocessed as mtmd does per
  projector family;
- ``multimodal``: :class:`Projector` (an mmproj file for a text model), prompts with media
  markers as chunks of tokens and image embeddings, decoded as mtmd_helper_eval_chunks does.

Import from the modules (``from ferrollama.generation.sampler import Sampler``): this package
imports none of them itself, so that loading one (the sampler, for ``import ferrollama``) does
not load the others (the scheduler's asyncio and threads).
"""
