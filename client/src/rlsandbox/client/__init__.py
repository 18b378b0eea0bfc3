"""rlsandbox client (placeholder until the API lands)."""
