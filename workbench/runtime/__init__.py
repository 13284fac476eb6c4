"""The model side of a step: loading models and heads, model calls, tree masks, the static KV cache, the step engine."""
