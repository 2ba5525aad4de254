"""Speculum: run local LLMs with speculative decoding, and watch it work."""

__version__ = "0.1.0"
