"""Smoke runs: llama-bench and a real streaming llama-server against thresholds, with reports."""
