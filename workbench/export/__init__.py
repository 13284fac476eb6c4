"""Taking a tree or plan to an engine: engine formats, and the check of a plan in vLLM itself."""
