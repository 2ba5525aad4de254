"""An OpenAI-compatible HTTP API over the engine (`speculum serve`).

``service`` runs completions on the loaded models, one at a time and in arrival order, with
stop sequences and usage accounting; ``api`` is the HTTP side (Starlette): routes, request
validation, OpenAI's error shape, server-sent events, the API key.
"""
