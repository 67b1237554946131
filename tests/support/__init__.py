"""Helpers shared by the suites under tests/ (imported, never collected: no test_*.py here)."""
