"""Models: fetch from hubs into a content-addressed store, model recipes, lock, inspect, verify and remap."""
