"""Attacks on federated learning, one module per chapter topic (import the module you need)."""
