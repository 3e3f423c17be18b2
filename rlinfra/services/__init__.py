"""Distributed services between workers: weights (the version barrier and its transports) and
naming (a KV with TTLs and watches); each is imported from its own module, one door per name."""
