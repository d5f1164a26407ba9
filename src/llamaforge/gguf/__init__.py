"""GGUF files: the hardened header reader and the tiny random-weight model writer."""
