"""Text and token ids for both sides: the model's tokenizer.json and chat template (the frontend's, and
the offline LLM's for text prompts), with special-token text kept as text."""
