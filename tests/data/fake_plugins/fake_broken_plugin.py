"""Fake plugin (tests): fails at import, as a plugin with a missing dependency does."""

raise ImportError("fake_broken_plugin needs libfoo, which is not installed")
