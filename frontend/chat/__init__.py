"""Chat: messages and tools into the template's inputs, a forced tool choice as a structural tag, and
the reply split into reasoning, text and tool calls."""
