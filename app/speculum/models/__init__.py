"""Model files: GGUF headers, the bundled demo weights, the local library, downloads."""
