"""Grammar-constrained decoding: ``state`` (llama.cpp's grammar sampler, followed token by token),
``lazy`` (a grammar held back until the answer writes a trigger: tool calls), ``schema`` (JSON
schemas and ``response_format`` as grammars), ``keywords`` (what is enforced, what refused) and
``patterns`` (a schema's regular expressions as the converter reads them)."""
