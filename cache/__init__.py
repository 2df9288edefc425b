"""Versioned on-disk formats: classifier caches (stage 1) and oracle outputs (stage 2)."""
