"""Text out of token ids: the incremental detokenizer with stop strings, each completion's stream of
response fields, and the logprob entries as text."""
