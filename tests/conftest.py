"""Shared fixtures. Test doubles (tiny models, toy tokenizers) live in tests/factories."""
