"""End-to-end tests need the Qwen3 plugin and transformers (the oracle): both are installed with
the test extras, so a missing one is an import error, not a skip."""
