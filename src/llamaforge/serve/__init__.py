"""Serving llama.cpp: the GPU fit planner and what it needs to know about llama-server."""
